// The SSD tier's read path: records adjacent on disk read together when coalescing is on, a damaged
// record inside a merged read quarantined alone, and large batches split over threads answering in
// request order.
#include <gtest/gtest.h>

#include "tests/tiers/ssd/ssd_tier_fixture.h"

namespace kvtier {
namespace {

using testing::request_for;
using testing::seeded_block;
using testing::small_ssd_options;
using testing::SsdTierTest;

// A batch large enough to be split over threads answers in request order, each block exact, and a
// damaged record is the only miss.
TEST_F(SsdTierTest, ALargeBatchSplitOverThreadsAnswersInOrder) {
  auto o = small_ssd_options(dir_.str());
  o.capacity_bytes = 32 << 20;
  auto tier = open(o);
  std::vector<BlockRef> blocks;
  for (uint64_t s = 0; s < 150; ++s) {
    blocks.push_back(seeded_block(by_dtype_[2], s));
    ASSERT_TRUE(tier->insert(blocks.back()).ok());
  }
  tier->flush();
  flip_byte_inside(*tier, entry_of(*tier, blocks[97]), 0x40);
  std::vector<size_t> order(blocks.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = (i * 37) % blocks.size();  // 37 is prime to 150
  std::vector<BlockRequest> requests;
  for (size_t i : order) requests.push_back(request_for(blocks[i]));
  const auto got = tier->read_many(requests);
  ASSERT_EQ(got.size(), blocks.size());
  for (size_t k = 0; k < got.size(); ++k) {
    if (order[k] == 97) {
      EXPECT_FALSE(got[k].ok());
      continue;
    }
    ASSERT_TRUE(got[k].ok()) << "request " << k;
    EXPECT_TRUE(testing::same_bytes(**got[k], *blocks[order[k]])) << "request " << k;
  }
  EXPECT_EQ(tier->metrics().corrupt_total(), 1u);
  EXPECT_EQ(tier->metrics().read_hits.value(), 149u);
}


// Small records that lie back to back are read in a few large ops and split after, every block
// bit-exact; with coalescing off it is one op per record, as the reference.
TEST_F(SsdTierTest, AdjacentRecordsAreReadInFewOpsAndEachBlockIsExact) {
  for (const uint64_t coalesce : {uint64_t{0}, uint64_t{4} << 20}) {
    testing::TempDir dir;
    auto o = small_ssd_options(dir.str());
    o.coalesce_read_bytes = coalesce;
    auto tier = open(o);
    std::vector<BlockRef> blocks;
    std::vector<BlockRequest> requests;
    for (uint64_t s = 0; s < 40; ++s) {
      blocks.push_back(seeded_block(by_dtype_[2], s));
      ASSERT_TRUE(tier->insert(blocks.back()).ok());
    }
    tier->flush();
    for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) requests.push_back(request_for(*it));  // any order
    const auto got = tier->read_many(requests);
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(got[i].ok()) << got[i].status().to_string();
      EXPECT_TRUE(testing::same_bytes(**got[i], *blocks[blocks.size() - 1 - i]));
    }
    const uint64_t segments = tier->state_for_testing().segments.count();
    if (coalesce == 0) {
      EXPECT_EQ(tier->metrics().read_ops.value(), 40u);
      EXPECT_EQ(tier->metrics().coalesced_reads.value(), 0u);
    } else {
      // ~20 KiB records in 1 MiB segments: one op per segment they span.
      EXPECT_LE(tier->metrics().read_ops.value(), segments) << "40 records";
      EXPECT_GE(tier->metrics().coalesced_reads.value(), 1u);
    }
    EXPECT_EQ(tier->metrics().corrupt_total(), 0u);
  }
}


// A damaged record inside a coalesced read is quarantined alone; its neighbours in the same read
// are served, exact.
TEST_F(SsdTierTest, ADamagedRecordInsideACoalescedReadIsTheOnlyOneQuarantined) {
  auto o = small_ssd_options(dir_.str());
  o.coalesce_read_bytes = 4 << 20;
  auto tier = open(o);
  std::vector<BlockRef> blocks;
  std::vector<BlockRequest> requests;
  for (uint64_t s = 0; s < 5; ++s) {
    blocks.push_back(seeded_block(by_dtype_[2], s));
    ASSERT_TRUE(tier->insert(blocks.back()).ok());
    requests.push_back(request_for(blocks.back()));
  }
  tier->flush();
  const IndexEntry e = entry_of(*tier, blocks[2]);
  flip_byte_inside(*tier, e, 0x01);
  const auto got = tier->read_many(requests);
  EXPECT_EQ(tier->metrics().read_ops.value(), 1u) << "the five are adjacent";
  for (size_t i = 0; i < got.size(); ++i) {
    if (i == 2) {
      EXPECT_EQ(got[i].status().code(), StatusCode::kNotFound);
      continue;
    }
    ASSERT_TRUE(got[i].ok()) << i << ": " << got[i].status().to_string();
    EXPECT_TRUE(testing::same_bytes(**got[i], *blocks[i]));
  }
  EXPECT_EQ(tier->metrics().corrupt_checksum.value(), 1u);
  EXPECT_FALSE(tier->contains(blocks[2]->hash()));
}


}  // namespace
}  // namespace kvtier
