// CacheStack::persist_to_ssd, the shutdown's write of what RAM holds, on a real RAM tier over a
// real SSD tier: what it reports written is what the SSD holds afterwards, whatever the spill
// queue still held when it began.
#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "cache/cache_stack.h"
#include "tests/cache/ram_over_ssd.h"
#include "tests/support/temp_dir.h"

namespace kvtier {
namespace {

std::unique_ptr<CacheStack> open_stack(const std::string& dir) {
  CacheStackOptions o;
  o.layout = testing::ssd_sized_layout();
  o.ram.capacity_bytes = 64 << 20;  // holds everything this test puts there
  o.ssd.emplace();
  o.ssd->dir = dir;
  o.ssd->segment_size = 1 << 20;    // 16 KiB blocks (20 KiB records): 51 to a segment
  o.ssd->capacity_bytes = 4 << 20;  // 4 segments, ~200 blocks
  o.ssd->spill_queue_bytes = 64 << 20;
  auto s = CacheStack::open(std::move(o));
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return s.ok() ? std::move(s).value() : nullptr;
}

// A prompt of `n` blocks, each as a model would compute it.
std::vector<BlockRef> prompt_blocks(size_t n, uint32_t seed) {
  const PrefixHasher h = testing::ssd_sized_hasher();
  const std::vector<uint32_t> tokens = testing::prompt(16 * n, seed);  // the keys' spans point here
  const auto keys = h.keys(tokens, {});
  std::vector<BlockRef> out;
  for (size_t i = 0; i < keys.size(); ++i) out.push_back(testing::ssd_sized_block(h, keys, i));
  return out;
}

// Blocks 0 to `on_ssd` - 1 written to the SSD, then those `in_ram` picks, and the rest up to
// `total`, put in RAM; the shutdown's write then runs. Every block RAM held must be on the SSD
// afterwards, the ones it held only there reported written, none lost or displaced, and the
// writes must have reclaimed more than `reclaimed_at_least` entries (so this is the case named).
void expect_persist_keeps_all_ram_held(uint32_t seed, size_t on_ssd, size_t total,
                                       const std::function<bool(size_t)>& in_ram,
                                       uint64_t reclaimed_at_least) {
  testing::TempDir dir;
  auto stack = open_stack(dir.str());
  ASSERT_NE(stack, nullptr);
  const std::vector<BlockRef> blocks = prompt_blocks(total, seed);
  for (size_t i = 0; i < on_ssd; ++i) ASSERT_TRUE(stack->ssd()->insert(blocks[i]).ok());
  stack->ssd()->flush();
  std::vector<BlockHash> both, ram_only;
  for (size_t i = 0; i < total; ++i) {
    if (i < on_ssd && !in_ram(i)) continue;
    ASSERT_TRUE(stack->ram().insert(blocks[i]).ok());
    (i < on_ssd ? both : ram_only).push_back(blocks[i]->hash());
  }
  const uint64_t reclaimed_before = stack->ssd()->total(&SsdTierMetrics::entries_reclaimed);

  const CacheStack::Persisted p =
      stack->persist_to_ssd(std::chrono::steady_clock::now() + std::chrono::seconds(60));
  EXPECT_GT(stack->ssd()->total(&SsdTierMetrics::entries_reclaimed),
            reclaimed_before + reclaimed_at_least)
      << "the shutdown's writes did not reclaim the segments this case is about";
  EXPECT_EQ(p.written, ram_only.size());
  EXPECT_EQ(p.lost, 0u);
  EXPECT_EQ(p.displaced, 0u);
  for (const auto& set : {both, ram_only}) {
    const std::vector<bool> held = stack->ssd()->contains_many(set);
    EXPECT_EQ(static_cast<size_t>(std::count(held.begin(), held.end(), true)), set.size());
  }
  EXPECT_EQ(stack->close().ssd, 0u);
}

// The blocks RAM holds were queued for the SSD once, ahead of more than the SSD keeps (what a
// server under eviction pressure has queued when SIGTERM comes): their queued copies are reclaimed
// by the blocks behind them. The shutdown's write must come after the backlog, and count only what
// is held at the end.
TEST(CacheStackPersistTest, BlocksRamHoldsOutliveTheSpillQueuesBacklog) {
  testing::TempDir dir;
  auto stack = open_stack(dir.str());
  ASSERT_NE(stack, nullptr);

  // 8 blocks in RAM, their copies queued for the SSD in the middle of 1000 blocks only the queue
  // holds: the 300 behind them are more than the SSD keeps (~200). The queue still holds most of
  // it when the shutdown begins: every block is made before any is queued.
  const std::vector<BlockRef> queued = prompt_blocks(1000, 7);
  std::vector<BlockHash> in_ram;
  for (size_t i = 700; i < 708; ++i) {
    ASSERT_TRUE(stack->ram().insert(queued[i]).ok());
    in_ram.push_back(queued[i]->hash());
  }
  for (const BlockRef& b : queued) ASSERT_TRUE(stack->ssd()->insert(b).ok());

  const CacheStack::Persisted p =
      stack->persist_to_ssd(std::chrono::steady_clock::now() + std::chrono::seconds(60));
  const std::vector<bool> held = stack->ssd()->contains_many(in_ram);
  for (size_t i = 0; i < in_ram.size(); ++i) {
    EXPECT_TRUE(held[i]) << "block " << i
                         << " RAM held is not on the SSD after the shutdown's write";
  }
  EXPECT_EQ(p.lost, 0u);
  EXPECT_EQ(p.refused, 0u);
  EXPECT_EQ(p.written, in_ram.size()) << "their queued copies were reclaimed: written again";
  EXPECT_GT(stack->ssd()->total(&SsdTierMetrics::entries_reclaimed), 700u)
      << "the backlog went round the SSD several times";
  EXPECT_EQ(stack->close().ssd, 0u);
}

// Blocks RAM holds that sit on the SSD already, in its oldest segment: the shutdown's writes of
// the blocks only RAM holds reclaim that segment, so they are written once more after them (the
// SSD keeps both sets with room to spare). 0-9: in RAM and on the SSD, written first; 10-159: on
// the SSD only; 160-259: in RAM only.
TEST(CacheStackPersistTest, BlocksRamAndTheSsdBothHeldAreNotReclaimedByTheShutdownsWrites) {
  expect_persist_keeps_all_ram_held(
      11, 160, 260, [](size_t i) { return i < 10; }, 10);
}

// Blocks RAM holds spread over every segment of a full SSD: the shutdown's writes reclaim the
// oldest segments, writing their blocks once more reclaims the next ones, and so on. RAM holds
// less than the SSD keeps, so at the end all of it is there: none displaced, nothing lost. 0-199
// on the SSD (its four segments), every sixth of them in RAM too; 200-289 in RAM only.
TEST(CacheStackPersistTest, BlocksRamHeldInEverySegmentAreWrittenAgainUntilNoneIsDisplaced) {
  expect_persist_keeps_all_ram_held(
      13, 200, 290, [](size_t i) { return i % 6 == 0; }, 100);
}

// What persist_to_ssd reports written comes back when the directory is opened again, and its
// report adds up to what RAM held only there.
TEST(CacheStackPersistTest, WhatItReportsWrittenComesBackAfterAReopen) {
  testing::TempDir dir;
  const std::vector<BlockRef> blocks = prompt_blocks(100, 9);
  CacheStack::Persisted p;
  {
    auto stack = open_stack(dir.str());
    ASSERT_NE(stack, nullptr);
    for (const BlockRef& b : blocks) ASSERT_TRUE(stack->ram().insert(b).ok());
    p = stack->persist_to_ssd(std::chrono::steady_clock::now() + std::chrono::seconds(60));
    EXPECT_EQ(p.written, blocks.size());
    EXPECT_EQ(p.lost, 0u);
    EXPECT_EQ(stack->close().ssd, 0u);
  }
  auto again = open_stack(dir.str());
  ASSERT_NE(again, nullptr);
  size_t back = 0;
  for (const BlockRef& b : blocks) {
    auto got = again->ssd()->read(BlockRequest{b->hash(), {}});
    if (!got.ok()) {
      EXPECT_EQ(got.status().code(), StatusCode::kNotFound) << got.status().to_string();
      continue;
    }
    ++back;
    EXPECT_TRUE(std::ranges::equal((*got)->data(), b->data())) << "block " << b->hash().hex();
  }
  EXPECT_EQ(back, p.written);
}

}  // namespace
}  // namespace kvtier
