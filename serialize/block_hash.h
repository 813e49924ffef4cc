// BlockHash: the fixed-width identity of a block (32 bytes: SHA-256, or xxh3-128 in the first 16
// bytes with the rest zero). A value type usable as a map key and printable as 64 hex digits.
// How it is computed lives in cache/prefix_hasher; this is only the value.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>

#include "base/status.h"

namespace kvtier {

struct BlockHash {
  static constexpr size_t kSize = 32;
  std::array<uint8_t, kSize> bytes{};

  std::string hex() const;
  static Result<BlockHash> from_hex(std::string_view hex);
  bool is_zero() const;

  auto operator<=>(const BlockHash&) const = default;
  bool operator==(const BlockHash&) const = default;
};

struct BlockHashHasher {
  size_t operator()(const BlockHash& h) const {
    // The bytes are already a uniform hash; any 8 of them make a good bucket index.
    uint64_t v;
    std::memcpy(&v, h.bytes.data(), sizeof(v));
    return static_cast<size_t>(v);
  }
};

}  // namespace kvtier

template <>
struct std::hash<kvtier::BlockHash> : kvtier::BlockHashHasher {};
