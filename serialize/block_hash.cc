#include "serialize/block_hash.h"

namespace kvtier {

std::string BlockHash::hex() const {
  static const char digits[] = "0123456789abcdef";
  std::string out(kSize * 2, '0');
  for (size_t i = 0; i < kSize; ++i) {
    out[2 * i] = digits[bytes[i] >> 4];
    out[2 * i + 1] = digits[bytes[i] & 15];
  }
  return out;
}

Result<BlockHash> BlockHash::from_hex(std::string_view hex) {
  if (hex.size() != kSize * 2) {
    return invalid_argument("block hash must be " + std::to_string(kSize * 2) +
                            " hex digits, got " + std::to_string(hex.size()) + " characters");
  }
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  BlockHash h;
  for (size_t i = 0; i < kSize; ++i) {
    int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return invalid_argument("block hash has a non-hex character");
    h.bytes[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return h;
}

bool BlockHash::is_zero() const {
  for (uint8_t b : bytes) {
    if (b) return false;
  }
  return true;
}

}  // namespace kvtier
