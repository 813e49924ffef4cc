// Blocks for cache tests: real prefix-hashed identities on a small layout.
#pragma once

#include <memory>
#include <numeric>
#include <vector>

#include "cache/prefix_hasher.h"
#include "tests/support/test_blocks.h"
#include "tiers/tier.h"

namespace kvtier::testing {

inline std::shared_ptr<const KvLayout> small_layout() {
  static auto l = share(KvLayout::uniform("small", 1, 1, 8, 4, DType::kBF16));
  return l;
}

// SHA-256 prefix hashes in namespace "m" of `layout`.
inline PrefixHasher hasher_of(const KvLayout& layout) {
  return PrefixHasher(HashAlgorithm::kSha256, Namespace{"m", layout.fingerprint(), ""}, layout.block_size);
}

inline PrefixHasher small_hasher() { return hasher_of(*small_layout()); }

inline std::vector<uint32_t> prompt(size_t n, uint32_t seed) {
  std::vector<uint32_t> t(n);
  std::iota(t.begin(), t.end(), seed * 1000);
  return t;
}

// The block of `layout` a model would compute for keys[i], with data derived from its hash.
inline BlockRef computed_block(std::shared_ptr<const KvLayout> layout, const PrefixHasher& h,
                               const std::vector<BlockKey>& keys, size_t i) {
  Block b = make_block(std::move(layout), keys[i].hash.bytes[0] * 131 + keys[i].hash.bytes[1]);
  b.mutable_identity() = h.identity(keys, i, {});
  return std::make_shared<const Block>(std::move(b));
}

inline BlockRef computed_block(const PrefixHasher& h, const std::vector<BlockKey>& keys, size_t i) {
  return computed_block(small_layout(), h, keys, i);
}

}  // namespace kvtier::testing
