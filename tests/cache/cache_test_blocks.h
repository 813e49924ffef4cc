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

inline PrefixHasher small_hasher() {
  return PrefixHasher(HashAlgorithm::kSha256, Namespace{"m", small_layout()->fingerprint(), ""},
                      small_layout()->block_size);
}

inline std::vector<uint32_t> prompt(size_t n, uint32_t seed) {
  std::vector<uint32_t> t(n);
  std::iota(t.begin(), t.end(), seed * 1000);
  return t;
}

// The block a model would compute for keys[i], with data derived from its hash.
inline BlockRef computed_block(const PrefixHasher& h, const std::vector<BlockKey>& keys, size_t i) {
  Block b = make_block(small_layout(), keys[i].hash.bytes[0] * 131 + keys[i].hash.bytes[1]);
  b.mutable_identity() = h.identity(keys, i, {});
  return std::make_shared<const Block>(std::move(b));
}

}  // namespace kvtier::testing
