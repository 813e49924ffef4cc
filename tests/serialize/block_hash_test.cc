// std::hash<BlockHash> against hashes a client can choose: tables keyed by block hashes must not
// put hashes that share some of their bytes into one bucket.
#include "serialize/block_hash.h"

#include <algorithm>
#include <random>
#include <unordered_set>

#include <gtest/gtest.h>

namespace kvtier {
namespace {

size_t largest_bucket(const std::unordered_set<BlockHash>& set) {
  size_t most = 0;
  for (size_t b = 0; b < set.bucket_count(); ++b) most = std::max(most, set.bucket_size(b));
  return most;
}

// 20,000 hashes equal in their first 8 bytes (what the bucket was taken from), then 20,000 equal
// in all but their last 8: a table of either spreads them as it would random hashes (at a load
// factor of 1, buckets of a handful), not one bucket walked at every lookup.
TEST(BlockHashTest, HashesSharingMostOfTheirBytesDoNotShareABucket) {
  std::mt19937_64 rng(5);
  for (const size_t varying_from : {size_t{8}, size_t{24}}) {
    SCOPED_TRACE("bytes " + std::to_string(varying_from) + "-31 vary");
    std::unordered_set<BlockHash> set;
    BlockHash h;
    for (auto& b : h.bytes) b = static_cast<uint8_t>(rng());
    while (set.size() < 20000) {
      for (size_t i = varying_from; i < BlockHash::kSize; ++i)
        h.bytes[i] = static_cast<uint8_t>(rng());
      set.insert(h);
    }
    EXPECT_LE(largest_bucket(set), 16u);
  }
}

}  // namespace
}  // namespace kvtier
