// Plans for an engine kvtier does not run (cache/plan/engine_planner.h), against rates stated as an
// 8B-shaped model on the H100 would show them (issue 53's arithmetic): a prefill of 33 us a token,
// RAM loads at 50 GB/s, one SSD at 1.7 GB/s, 2 MiB blocks of 16 tokens.
#include "cache/plan/engine_planner.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvtier {
namespace {

constexpr uint64_t kBlockBytes = 2ull << 20;
constexpr uint32_t kBlockSize = 16;
constexpr double kPerToken = 33e-6;
constexpr size_t kRam = 0, kSsd = 1;  // kvtier's tiers without a GPU tier

std::vector<int> prefix(size_t blocks, int tier) { return std::vector<int>(blocks, tier); }

void state_rates(EnginePlanner& p, double ssd_bytes_per_second) {
  p.set_prefill(0.0005, kPerToken, 0);
  p.set_load(kRam, 0.0002, 50e9);
  p.set_load(kSsd, 0.001, ssd_bytes_per_second);
}

TEST(EnginePlannerTest, LoadsFromRamSplitsFromTheSsdAndComputesWhenTheDiskIsFarSlower) {
  const HitCostModel kvtier;
  const size_t n = 511;  // 8192 tokens: the cached prefix stops a block short, the rest is computed
  {
    EnginePlanner p;
    state_rates(p, 1.7e9);
    const EnginePlan ram =
        p.plan(prefix(n, kRam), kBlockBytes, kBlockSize, 16, kvtier, HitPolicy::kCost);
    EXPECT_EQ(ram.hit.cached_blocks, n);
    EXPECT_EQ(ram.hit.gpu_blocks, 0u) << "the engine's memory is no tier of ours";
    // RAM at 50 GB/s loads 8k tokens in 21 ms against 270 to compute them: it loads nearly all, and
    // computes the first few blocks meanwhile (loads run beside the engine's compute).
    EXPECT_LT(ram.hit.compute_blocks, n / 8);
    ASSERT_TRUE(ram.hit.predicted && ram.hit.load_only && ram.hit.compute_only);
    EXPECT_LE(*ram.hit.predicted, *ram.hit.load_only);
    EXPECT_LT(*ram.hit.predicted * 8, *ram.hit.compute_only);

    const EnginePlan ssd =
        p.plan(prefix(n, kSsd), kBlockBytes, kBlockSize, 16, kvtier, HitPolicy::kCost);
    EXPECT_GT(ssd.hit.compute_blocks, n / 2)
        << "the disk brings less than computing in the same time";
    EXPECT_LT(ssd.hit.compute_blocks, n);
    ASSERT_TRUE(ssd.hit.predicted && ssd.hit.load_only && ssd.hit.compute_only);
    EXPECT_LT(*ssd.hit.predicted, 0.8 * *ssd.hit.compute_only);
    EXPECT_LT(*ssd.hit.predicted, 0.4 * *ssd.hit.load_only);
  }
  EnginePlanner slow;
  state_rates(slow, 0.1e9);  // a busy network disk: 20 s to load what computes in 0.27
  const EnginePlan plan =
      slow.plan(prefix(n, kSsd), kBlockBytes, kBlockSize, 16, kvtier, HitPolicy::kCost);
  EXPECT_EQ(plan.hit.compute_blocks, n);
  EXPECT_FALSE(plan.deadline) << "nothing loads";
}

TEST(EnginePlannerTest, PlansAPureLoadUntilItKnowsThePrefill) {
  const HitCostModel kvtier;
  EnginePlanner p;
  p.set_load(kRam, 0.0002, 50e9);
  const std::vector<int> tiers = prefix(64, kRam);
  EXPECT_EQ(p.plan(tiers, kBlockBytes, kBlockSize, 16, kvtier, HitPolicy::kCost).hit.compute_blocks,
            0u);
  // Three prefills that determine the fit, slow enough that computing wins.
  for (uint64_t t : {256, 1024, 4096}) p.observe_prefill(t, 0, 1e-9 * t);
  EXPECT_EQ(p.plan(tiers, kBlockBytes, kBlockSize, 16, kvtier, HitPolicy::kCost).hit.compute_blocks,
            64u);
  EXPECT_EQ(p.plan(tiers, kBlockBytes, kBlockSize, 16, kvtier, HitPolicy::kLoad).hit.compute_blocks,
            0u);
}

TEST(EnginePlannerTest, AnSsdNotTimedYetIsRamsLoadPlusKvtiersOwnRestore) {
  HitCostModel kvtier;
  kvtier.set_restore(kSsd, 0.001, 1.7e9);  // what kvtier's fetches from the SSD into RAM measured
  EnginePlanner p;
  p.set_prefill(0.0005, kPerToken, 0);
  p.set_load(kRam, 0.0002, 50e9);
  const EnginePlan plan =
      p.plan(prefix(100, kSsd), kBlockBytes, kBlockSize, 16, kvtier, HitPolicy::kLoad);
  ASSERT_TRUE(plan.hit.load_seconds);
  const double bytes = 100.0 * kBlockBytes;
  EXPECT_NEAR(*plan.hit.load_seconds, 0.0012 + bytes / 50e9 + bytes / 1.7e9, 1e-4);
  // Once a pure load from the SSD was timed end to end, that is the estimate.
  p.set_load(kSsd, 0.0, 1.0e9);
  const EnginePlan timed =
      p.plan(prefix(100, kSsd), kBlockBytes, kBlockSize, 16, kvtier, HitPolicy::kLoad);
  EXPECT_NEAR(*timed.hit.load_seconds, bytes / 1.0e9, 1e-4);
}

TEST(EnginePlannerTest, TheDeadlineIsTwiceTheLoadOrTheRecomputeWhicheverIsLonger) {
  const HitCostModel kvtier;
  EnginePlanner p;
  state_rates(p, 1.7e9);
  const EnginePlan ram =
      p.plan(prefix(511, kRam), kBlockBytes, kBlockSize, 16, kvtier, HitPolicy::kCost);
  ASSERT_TRUE(ram.deadline && ram.hit.compute_only);
  EXPECT_DOUBLE_EQ(*ram.deadline, *ram.hit.compute_only + EnginePlanner::kDeadlineSlack)
      << "a RAM load takes 21 ms: the recompute's 270 ms is the longer wait";
  const EnginePlan ssd =
      p.plan(prefix(511, kSsd), kBlockBytes, kBlockSize, 16, kvtier, HitPolicy::kLoad);
  ASSERT_TRUE(ssd.deadline && ssd.hit.load_seconds);
  EXPECT_DOUBLE_EQ(*ssd.deadline, 2 * *ssd.hit.load_seconds + EnginePlanner::kDeadlineSlack);
}

TEST(EnginePlannerTest, ATierWhoseBlocksKeepBeingComputedIsLoadedNowAndThenToTimeItAgain) {
  const HitCostModel kvtier;
  EnginePlanner p;
  state_rates(p, 0.1e9);
  const std::vector<int> tiers = prefix(511, kSsd);
  size_t probes = 0, first = 0;
  for (size_t i = 1; i <= 2 * EnginePlanner::kProbeAfter; ++i) {
    const EnginePlan plan = p.plan(tiers, kBlockBytes, kBlockSize, 16, kvtier, HitPolicy::kCost);
    if (plan.hit.probe) {
      ++probes;
      if (first == 0) first = i;
      EXPECT_EQ(plan.hit.compute_blocks, 0u) << "a probe loads everything";
      ASSERT_TRUE(plan.deadline && plan.hit.compute_only);
      EXPECT_DOUBLE_EQ(*plan.deadline, *plan.hit.compute_only + EnginePlanner::kDeadlineSlack)
          << "a probe is waited for only until a recompute would have finished";
      p.observe_load(kSsd, tiers.size() * kBlockBytes, 20.0);  // as slow as estimated
    }
  }
  EXPECT_EQ(first, EnginePlanner::kProbeAfter);
  EXPECT_EQ(probes, 1u) << "a probe that found the estimate right doubles the wait for the next";
}

TEST(EnginePlannerTest, PureLoadsTeachTheTiersAndSplitsTeachTheOverlap) {
  const HitCostModel kvtier;
  EnginePlanner p;
  p.set_prefill(0.0005, kPerToken, 0);
  EXPECT_FALSE(p.model().restore_seconds(kSsd + 1, kBlockBytes));
  p.observe_load(kSsd, 64 * kBlockBytes, 1.0);  // the first only warms up
  for (int i = 0; i < 3; ++i) p.observe_load(kSsd, 64 * kBlockBytes, 0.08);
  ASSERT_TRUE(p.model().restore_seconds(kSsd + 1, 64 * kBlockBytes));
  EXPECT_NEAR(*p.model().restore_seconds(kSsd + 1, 64 * kBlockBytes), 0.08, 1e-6);

  const EnginePlan split =
      p.plan(prefix(511, kSsd), kBlockBytes, kBlockSize, 16, kvtier, HitPolicy::kCost);
  ASSERT_GT(split.hit.compute_blocks, 0u);
  ASSERT_LT(split.hit.compute_blocks, 511u);
  ASSERT_TRUE(split.hit.overlap_alone);
  EXPECT_DOUBLE_EQ(p.model().overlap_factor(), 1.0);
  p.observe_split(split.hit, 1.5 * *split.hit.overlap_alone);
  EXPECT_GT(p.model().overlap_factor(), 1.0);
  const double after = p.model().overlap_factor();
  HitPlan pure;  // a pure load teaches no overlap
  pure.cached_blocks = 511;
  p.observe_split(pure, 10.0);
  EXPECT_DOUBLE_EQ(p.model().overlap_factor(), after);
}

}  // namespace
}  // namespace kvtier
