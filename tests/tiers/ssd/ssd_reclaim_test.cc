// The SSD tier at its capacity: the oldest segment goes first, blocks read since they were
// written move on (reinsertion), and moving them never costs the blocks just written.
#include <gtest/gtest.h>

#include "tests/tiers/ssd/ssd_tier_fixture.h"

namespace kvtier {
namespace {

using testing::request_for;
using testing::seeded_block;
using testing::small_ssd_options;
using testing::SsdTierTest;

TEST_F(SsdTierTest, OverCapacityTheOldestSegmentIsReclaimedFirst) {
  auto o = small_ssd_options(dir_.str());
  o.capacity_bytes = 3 << 20;  // three 1 MiB segments
  o.reinsert_read_blocks = false;
  auto tier = open(o);
  std::vector<BlockRef> blocks;
  for (uint64_t s = 0; s < 250; ++s) {  // ~20 KiB records: ~5 MiB in all
    blocks.push_back(seeded_block(by_dtype_[2], s));
    ASSERT_TRUE(tier->insert(blocks.back()).ok());
    if (s % 20 == 0) tier->flush();
  }
  tier->flush();
  EXPECT_LE(tier->used_bytes(), o.capacity_bytes);
  EXPECT_LE(tier->state_for_testing().segments.count(), 3u);
  EXPECT_GT(tier->metrics().segments_reclaimed.value(), 0u);
  EXPECT_FALSE(tier->contains(blocks.front()->hash())) << "the oldest went first";
  EXPECT_TRUE(tier->read(request_for(blocks.back())).ok()) << "the newest stays";
  // Everything still indexed is readable, and nothing reclaimed is.
  size_t held = 0;
  for (const auto& b : blocks) held += tier->read(request_for(b)).ok();
  EXPECT_EQ(held, tier->block_count());
  EXPECT_EQ(tier->metrics().corrupt_total(), 0u);
}

TEST_F(SsdTierTest, BlocksReadSinceTheyWereWrittenSurviveTheirSegmentsReclaim) {
  auto o = small_ssd_options(dir_.str());
  o.capacity_bytes = 3 << 20;
  auto tier = open(o);
  BlockRef hot = seeded_block(by_dtype_[2], 1), cold = seeded_block(by_dtype_[2], 2);
  ASSERT_TRUE(tier->insert(hot).ok());
  ASSERT_TRUE(tier->insert(cold).ok());
  tier->flush();
  ASSERT_TRUE(tier->read(request_for(hot)).ok());
  const uint64_t first_segment = entry_of(*tier, hot).segment;
  for (uint64_t s = 10; s < 260; ++s) {
    ASSERT_TRUE(tier->insert(seeded_block(by_dtype_[2], s)).ok());
    if (s % 20 == 0) tier->flush();
  }
  tier->flush();
  ASSERT_EQ(tier->state_for_testing().segments.record(first_segment), std::nullopt)
      << "the first segment was reclaimed";
  EXPECT_GE(tier->metrics().reinserted.value(), 1u);
  auto got = tier->read(request_for(hot));
  ASSERT_TRUE(got.ok()) << "the block that was read moved on";
  EXPECT_TRUE(testing::same_bytes(**got, *hot));
  EXPECT_FALSE(tier->contains(cold->hash())) << "the one never read went with its segment";
}

// When every block on a full SSD was read since it was written, each reclaim used to move a whole
// segment's worth back into the writer's path: the room it freed was taken again, the next reclaim
// followed, and the cascade went round the disk until the segment holding the newest writes (never
// read, so not moved) was the oldest and went. A shutdown that wrote RAM's last blocks onto a busy
// disk lost them that way. A reclaim now moves at most half a segment, so each one frees room.
TEST_F(SsdTierTest, MovingReadBlocksNeverCostsTheBlocksJustWritten) {
  auto o = small_ssd_options(dir_.str());
  o.capacity_bytes = 4 << 20;  // four 1 MiB segments of ~20 KiB records
  auto tier = open(o);
  for (uint64_t s = 0; s < 400; ++s) {
    ASSERT_TRUE(tier->insert(seeded_block(by_dtype_[2], s)).ok());
    if (s % 20 == 19) tier->flush();
  }
  tier->flush();
  size_t held = 0;
  for (uint64_t s = 0; s < 400; ++s)
    held += tier->read(request_for(seeded_block(by_dtype_[2], s))).ok();
  ASSERT_GT(held, 100u) << "the disk is full of blocks, every one of them read";

  const uint64_t reclaimed = tier->metrics().segments_reclaimed.value();
  std::vector<BlockRef> fresh;
  for (uint64_t s = 1000; s < 1010; ++s) {
    fresh.push_back(seeded_block(by_dtype_[2], s));
    ASSERT_TRUE(tier->insert(fresh.back()).ok());
  }
  tier->flush();
  for (const auto& b : fresh) {
    auto got = tier->read(request_for(b));
    ASSERT_TRUE(got.ok()) << "a block just written was reclaimed to make room for moved ones";
    EXPECT_TRUE(testing::same_bytes(**got, *b));
  }
  // Ten records need one new segment; moving at most half of each reclaimed one, at most two.
  EXPECT_LE(tier->metrics().segments_reclaimed.value() - reclaimed, 2u);
  EXPECT_GT(tier->metrics().reinserted.value(), 0u) << "read blocks still move on";
  EXPECT_GT(tier->metrics().reinsert_skipped.value(), 0u) << "past half a segment, they go with it";
  EXPECT_EQ(tier->metrics().corrupt_total(), 0u);
}

// A restart keeps a full tier whole: room for the next segment is made when one is needed, not at
// open (which reclaimed the oldest segment, blocks the last run had reported written). A capacity
// lowered since is still enforced at open.
TEST_F(SsdTierTest, AFullTierKeepsEveryBlockAcrossARestartAndALowerCapacityIsEnforced) {
  auto o = small_ssd_options(dir_.str());
  o.capacity_bytes = 4 << 20;
  std::vector<BlockRef> blocks;
  size_t held = 0;
  {
    auto tier = open(o);
    for (uint64_t s = 0; s < 400; ++s) {
      blocks.push_back(seeded_block(by_dtype_[2], s));
      ASSERT_TRUE(tier->insert(blocks.back()).ok());
      if (s % 20 == 19) tier->flush();
    }
    tier->flush();
    ASSERT_EQ(tier->state_for_testing().segments.count(), 4u) << "full";
    held = tier->block_count();
  }
  {
    auto tier = open(o);
    EXPECT_EQ(tier->block_count(), held);
    EXPECT_EQ(served_exact(*tier, blocks), held)
        << "every block the last run held is served after the restart";
  }
  o.capacity_bytes = 2 << 20;
  auto tier = open(o);
  EXPECT_EQ(tier->state_for_testing().segments.count(), 2u) << "the two oldest went";
  EXPECT_LT(tier->block_count(), held);
  EXPECT_TRUE(tier->read(request_for(blocks.back())).ok()) << "the newest stay";
}

}  // namespace
}  // namespace kvtier
