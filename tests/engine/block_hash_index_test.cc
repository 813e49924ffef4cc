// BlockHashIndex, the GPU block pool's flat hash -> id map: what it stores it finds, erased entries
// leave the rest of their probe run findable, against std::unordered_map on the same operations.
#include "engine/blocks/block_hash_index.h"

#include <gtest/gtest.h>

#include <random>
#include <unordered_map>
#include <vector>

namespace kvtier {
namespace {

BlockHash hash_of(std::mt19937_64& rng) {
  BlockHash h;
  for (auto& b : h.bytes) b = static_cast<uint8_t>(rng());
  return h;
}

// Random inserts and erases up to the table's room, where runs are long and wrap around the end
// (16 slots for 8 entries), every find compared with a reference map after every step.
TEST(BlockHashIndexTest, AgreesWithAReferenceMapThroughInsertsAndErases) {
  for (const size_t room : {1u, 8u, 100u}) {
    std::mt19937_64 rng(room);
    BlockHashIndex index(room);
    std::unordered_map<BlockHash, int32_t> want;
    std::vector<BlockHash> seen;
    for (int step = 0; step < 4000; ++step) {
      if (want.size() < room && (want.empty() || rng() % 2 == 0)) {
        const BlockHash h = hash_of(rng);
        const int32_t id = static_cast<int32_t>(rng() % 1000);
        index.insert(h, id);
        want.emplace(h, id);
        seen.push_back(h);
      } else {
        auto it = want.begin();
        std::advance(it, static_cast<std::ptrdiff_t>(rng() % want.size()));
        EXPECT_TRUE(index.erase(it->first));
        EXPECT_FALSE(index.erase(it->first));
        want.erase(it);
      }
      ASSERT_EQ(index.size(), want.size());
      for (const BlockHash& h : seen) {
        auto it = want.find(h);
        ASSERT_EQ(index.find(h), it == want.end() ? -1 : it->second)
            << "room " << room << " step " << step;
      }
    }
  }
}

// Hashes alike in all but one byte (a client can send any 32 bytes) are as findable as any.
TEST(BlockHashIndexTest, HashesDifferingInOneByteAreEachFound) {
  BlockHashIndex index(256);
  std::vector<BlockHash> hashes(256);
  for (int i = 0; i < 256; ++i) {
    hashes[i].bytes[31] = static_cast<uint8_t>(i);
    index.insert(hashes[i], i);
  }
  for (int i = 0; i < 256; ++i) EXPECT_EQ(index.find(hashes[i]), i);
  for (int i = 0; i < 256; i += 2) EXPECT_TRUE(index.erase(hashes[i]));
  for (int i = 0; i < 256; ++i) EXPECT_EQ(index.find(hashes[i]), i % 2 == 0 ? -1 : i);
  EXPECT_EQ(index.size(), 128u);
}

}  // namespace
}  // namespace kvtier
