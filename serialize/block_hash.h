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

// For hash tables in this process (std::hash<BlockHash>, and BlockHashIndex's slots, its top
// bits): all 32 bytes mixed with odd factors drawn when the process starts. Block hashes come
// from clients (PUT), so any 8 of their bytes as the bucket (as it was) let one send any number of
// hashes into the same bucket of every table keyed by them, each lookup and insert then walking
// all of them. A multiply-and-add, not SipHash (base/hashing/keyed_hash.h): a table hashes on
// every find, several tables per block moved. Its one weakness, differences in the words' top
// bits cancelling in pairs whatever the factors, puts at most eight chosen hashes together, a
// bucket's normal share; where one equal result would be wrong, not slow (the SSD's
// fingerprints), SipHash is used. Not stable across processes: nothing kept on disk may use it.
struct BlockHashHasher {
  size_t operator()(const BlockHash& h) const {
    static const std::array<uint64_t, 4> factors = draw_factors();
    uint64_t w[4];
    std::memcpy(w, h.bytes.data(), sizeof(w));
    uint64_t v = w[0] * factors[0] + w[1] * factors[1] + w[2] * factors[2] + w[3] * factors[3];
    return static_cast<size_t>(v ^ (v >> 32));  // the high bits reach a prime bucket count
  }
  static std::array<uint64_t, 4> draw_factors();
};

}  // namespace kvtier

template <>
struct std::hash<kvtier::BlockHash> : kvtier::BlockHashHasher {};
