#include "server/wire/wire_format.h"

#include <cstring>
#include <string>

namespace kvtier::wire {
namespace {

template <typename T>
void put_le(uint8_t* p, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<uint8_t>(static_cast<uint64_t>(v) >> (8 * i));
}

template <typename T>
T get_le(const uint8_t* p) {
  uint64_t v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return static_cast<T>(v);
}

}  // namespace

const char* op_name(Op op) {
  switch (op) {
    case Op::kHello: return "hello";
    case Op::kPut: return "put";
    case Op::kGet: return "get";
    case Op::kBatchGet: return "batch_get";
    case Op::kDelete: return "delete";
  }
  return "unknown";
}

// Request: magic u32 | op u8 | reserved u8 (0) | namespace_bytes u16 | body_bytes u64 | hash[32]
std::array<uint8_t, kRequestHeaderBytes> encode(const RequestHeader& h) {
  std::array<uint8_t, kRequestHeaderBytes> b{};
  put_le<uint32_t>(&b[0], kMagic);
  b[4] = static_cast<uint8_t>(h.op);
  put_le<uint16_t>(&b[6], h.namespace_bytes);
  put_le<uint64_t>(&b[8], h.body_bytes);
  std::memcpy(&b[16], h.hash.bytes.data(), BlockHash::kSize);
  return b;
}

// Response: magic u32 | status u16 | reserved u16 (0) | body_bytes u64
std::array<uint8_t, kResponseHeaderBytes> encode(const ResponseHeader& h) {
  std::array<uint8_t, kResponseHeaderBytes> b{};
  put_le<uint32_t>(&b[0], kMagic);
  put_le<uint16_t>(&b[4], h.status);
  put_le<uint64_t>(&b[8], h.body_bytes);
  return b;
}

Result<RequestHeader> decode_request(std::span<const uint8_t, kRequestHeaderBytes> b) {
  if (get_le<uint32_t>(&b[0]) != kMagic) return invalid_argument("not a kvtier binary request (wrong magic)");
  const uint8_t op = b[4];
  if (op < static_cast<uint8_t>(Op::kHello) || op > static_cast<uint8_t>(Op::kDelete)) {
    return invalid_argument("unknown op " + std::to_string(op));
  }
  if (b[5] != 0) return invalid_argument("reserved byte 5 is not zero");
  RequestHeader h;
  h.op = static_cast<Op>(op);
  h.namespace_bytes = get_le<uint16_t>(&b[6]);
  h.body_bytes = get_le<uint64_t>(&b[8]);
  std::memcpy(h.hash.bytes.data(), &b[16], BlockHash::kSize);
  return h;
}

Result<ResponseHeader> decode_response(std::span<const uint8_t, kResponseHeaderBytes> b) {
  if (get_le<uint32_t>(&b[0]) != kMagic) return invalid_argument("not a kvtier binary response (wrong magic)");
  if (get_le<uint16_t>(&b[6]) != 0) return invalid_argument("reserved bytes 6-7 are not zero");
  return ResponseHeader{get_le<uint16_t>(&b[4]), get_le<uint64_t>(&b[8])};
}

}  // namespace kvtier::wire
