// The hit planner and the cost model it reads: fits that recover the costs they are fed, and
// splits that follow the costs — load when loading is cheap, compute when computing is, both at
// once in between, and never recompute what already lies on the GPU.
#include "cache/plan/hit_planner.h"

#include <gtest/gtest.h>

#include <utility>
#include <vector>

namespace kvtier {
namespace {

constexpr uint64_t kBlockBytes = 1 << 20;

TEST(HitCostModelTest, RecoversAFixedCostAndARateFromRestores) {
  HitCostModel m;
  EXPECT_FALSE(m.restore_seconds(1, kBlockBytes)) << "unknown before any sample";
  m.observe_restore(1, 8ull << 20, 0.5);  // the first: one-off costs, ignored
  EXPECT_FALSE(m.restore_seconds(1, kBlockBytes)) << "a tier's first restore only warms up";
  for (uint64_t mib : {1, 8, 64, 3}) m.observe_restore(1, mib << 20, 0.002 + mib * 0.001);
  EXPECT_NEAR(*m.restore_seconds(1, 100ull << 20), 0.002 + 0.1, 1e-9);
  EXPECT_FALSE(m.restore_seconds(2, kBlockBytes)) << "each tier has its own";
}

// kvtierd's GETs and an engine's repeated prompts restore the same number of blocks each time: the
// fixed cost cannot be told from the rate then, and the estimate goes through the origin.
TEST(HitCostModelTest, RestoresOfOneSizeStillGiveAnEstimateNearThatSize) {
  HitCostModel m;
  m.observe_restore(1, 4ull << 20, 0.040);  // warm-up, ten times the rest: not in the estimate
  m.observe_restore(1, 4ull << 20, 0.004);
  m.observe_restore(1, 4ull << 20, 0.006);
  const auto s = m.restore_seconds(1, 4ull << 20);
  ASSERT_TRUE(s);
  EXPECT_NEAR(*s, 0.005, 0.0011);
}

TEST(HitCostModelTest, RecentSamplesOutweighOldOnes) {
  HitCostModel m;
  m.observe_restore(2, 1ull << 20, 0.001);  // warm-up
  for (int i = 0; i < 10; ++i) m.observe_restore(2, (1ull + i % 4) << 20, ((1 + i % 4) * 0.001));
  for (int i = 0; i < 200; ++i)
    m.observe_restore(2, (1ull + i % 4) << 20, ((1 + i % 4) * 0.004));  // the disk got busy
  EXPECT_NEAR(*m.restore_seconds(2, 10ull << 20), 0.04, 0.001);
}

TEST(HitCostModelTest, RecoversAPrefillCostWithItsAttentionTerm) {
  HitCostModel m;
  auto cost = [](double t, double ctx) { return 0.0005 + 2e-6 * t + 1e-10 * t * (ctx + t / 2); };
  for (auto [t, ctx] :
       {std::pair{16, 0}, {512, 0}, {2048, 0}, {512, 4096}, {2048, 8192}, {64, 30000}}) {
    m.observe_prefill(t, ctx, cost(t, ctx));
  }
  EXPECT_NEAR(*m.prefill_seconds(4096, 16384), cost(4096, 16384), 1e-9);
}

// One slow sample (a pipeline compiled for a new shape, a scratch buffer grown) must not rule
// the fit; two in a row are the machine getting slower, and are taken.
TEST(HitCostModelTest, AOneOffSlowSampleIsDroppedAndCountedTwoInARowAreTaken) {
  HitCostModel m;
  auto cost = [](double t, double ctx) { return 0.0003 + 1e-6 * t + 1e-10 * t * (ctx + t / 2); };
  for (auto [t, ctx] : {std::pair{64, 0}, {4096, 0}, {4096, 4096}, {8192, 0}})
    m.observe_prefill(t, ctx, cost(t, ctx));
  const double before = *m.prefill_seconds(16, 8176);
  m.observe_prefill(8192, 0, 15 * cost(8192, 0));  // the first forward of this length
  m.observe_prefill(8192, 0, cost(8192, 0));
  EXPECT_NEAR(*m.prefill_seconds(16, 8176), before, 1e-9) << "the one-off moved the estimate";
  EXPECT_EQ(m.outliers_dropped(), std::make_pair(uint64_t{1}, uint64_t{0}));
  for (int i = 0; i < 2; ++i) m.observe_prefill(8192, 0, 15 * cost(8192, 0));
  EXPECT_GT(*m.prefill_seconds(8192, 0), 4 * cost(8192, 0)) << "a slower machine must be seen";
  EXPECT_EQ(m.outliers_dropped().first, 1u);

  // Restores likewise, per tier: a disk's hiccup.
  m.observe_restore(2, 8ull << 20, 0.010);  // warm-up
  for (int i = 0; i < 3; ++i) m.observe_restore(2, 8ull << 20, 0.010);
  m.observe_restore(2, 8ull << 20, 0.100);
  m.observe_restore(2, 8ull << 20, 0.010);
  EXPECT_NEAR(*m.restore_seconds(2, 8ull << 20), 0.010, 1e-9);
  EXPECT_EQ(m.outliers_dropped().second, 1u);
}

struct Costs {
  HitCostModel model;
  // Restore from RAM (tier 1) and SSD (tier 2) at these rates; prefill at this many tokens/s.
  Costs(double ram_gbps, double ssd_gbps, double tokens_per_s) {
    model.set_restore(1, 0, ram_gbps * 1e9);
    model.set_restore(2, 0, ssd_gbps * 1e9);
    model.set_prefill(0, 1 / tokens_per_s, 0);
  }
};

// Loads from the SSD (tier 2) run beside compute; loads from RAM (tier 1) after it.
HitPlanInput input(const std::vector<int>& tiers, uint64_t rest = 16) {
  HitPlanInput in{tiers, kBlockBytes, 16, rest, {}};
  in.overlaps_compute[2] = true;
  return in;
}

TEST(HitPlannerTest, CheapLoadsAreLoadedAndCheapComputeIsComputed) {
  const std::vector<int> ssd(64, 2);
  // 64 MiB at 10 GB/s is 6.7 ms; 1024 tokens at 1M tokens/s is 1 ms: compute wins...
  HitPlan fast_gpu = plan_hit(input(ssd), Costs(20, 10, 1e6).model, HitPolicy::kCost);
  EXPECT_GT(fast_gpu.compute_blocks, 50u);
  // ...and at 10k tokens/s (102 ms) the load does.
  HitPlan slow_gpu = plan_hit(input(ssd), Costs(20, 10, 1e4).model, HitPolicy::kCost);
  EXPECT_LT(slow_gpu.compute_blocks, 10u);
}

TEST(HitPlannerTest, WhenBothCostTheSameTheSplitOverlapsThemAndBeatsEither) {
  const std::vector<int> ssd(64, 2);
  // Load 64 MiB at 1 GB/s: 67 ms. Compute 1024 tokens at 15k tokens/s: 68 ms.
  Costs c(20, 1, 15e3);
  const HitPlan p = plan_hit(input(ssd), c.model, HitPolicy::kCost);
  EXPECT_GT(p.compute_blocks, 20u);
  EXPECT_LT(p.compute_blocks, 44u);
  ASSERT_TRUE(p.predicted && p.load_only && p.compute_only);
  // Meeting in the middle: about 1 / (1/load + 1/compute) of the work, near half of either.
  EXPECT_LT(*p.predicted, 0.6 * std::min(*p.load_only, *p.compute_only));
}

TEST(HitPlannerTest, ALoadThatCannotRunBesideComputeIsNeverSplit) {
  // RAM's load queues behind compute: a split only adds the front's time to the load's.
  const std::vector<int> ram(64, 1);
  Costs c(1, 1, 15e3);
  const HitPlan p = plan_hit(input(ram), c.model, HitPolicy::kCost);
  EXPECT_TRUE(p.compute_blocks == 0 || p.compute_blocks == 64) << p.compute_blocks;
}

TEST(HitPlannerTest, BlocksOnTheGpuAreNeverRecomputed) {
  std::vector<int> tiers(8, 0);
  tiers.insert(tiers.end(), 8, 2);
  const HitPlan p = plan_hit(input(tiers), Costs(20, 0.001, 1e9).model, HitPolicy::kCompute);
  EXPECT_EQ(p.gpu_blocks, 8u);
  EXPECT_EQ(p.compute_blocks, 16u);
  const HitPlan load = plan_hit(input(tiers), Costs(20, 10, 1).model, HitPolicy::kCost);
  EXPECT_EQ(load.compute_blocks, 8u) << "a pure load starts after the GPU's blocks";
}

TEST(HitPlannerTest, WithoutEstimatesItLoads) {
  const std::vector<int> ram(16, 1);
  HitCostModel unknown;
  const HitPlan p = plan_hit(input(ram), unknown, HitPolicy::kCost);
  EXPECT_EQ(p.compute_blocks, 0u);
  EXPECT_FALSE(p.predicted);
  EXPECT_FALSE(p.load_seconds);
}

// An SSD stack's one-block RAM tier holds the prefix's last block now and then; a fetch that reads
// it reads the SSD too and is charged to the SSD, so RAM is never timed there. Its block must not
// make the whole plan unknown (a pure load then: the H100's tiny model lost 2x to recomputing).
TEST(HitPlannerTest, ATierNotTimedYetTakesTheNextSlowerTiersPace) {
  std::vector<int> tiers(63, 2);
  tiers.push_back(1);
  HitCostModel m;
  m.set_restore(2, 0, 0.5e9);  // 64 MiB from the SSD: 134 ms
  m.set_prefill(0, 1e-6, 0);   // 1024 tokens: 1 ms
  const HitPlan p = plan_hit(input(tiers), m, HitPolicy::kCost);
  ASSERT_TRUE(p.load_only && p.compute_only);
  EXPECT_EQ(p.compute_blocks, 64u);
  EXPECT_NEAR(*p.load_only, 0.001 * 16 / 1024 + 64 * (1 << 20) / 0.5e9, 1e-6)
      << "RAM's block at the SSD's pace";
}

// A load predicted to win by less than min_gain is not worth its risk; by more it is taken.
TEST(HitPlannerTest, ALoadThatWinsByLessThanTheMarginIsComputed) {
  const std::vector<int> ram(64, 1);  // 64 MiB; RAM loads do not overlap compute: no splits
  for (auto [ram_gbps, computes] : {std::pair{0.0671e9 / 0.95, true}, {0.0671e9 / 0.8, false}}) {
    HitCostModel m;
    m.set_restore(1, 0, ram_gbps);    // 64 MiB in ~0.95 or ~0.8 of a second
    m.set_prefill(0, 1.0 / 1024, 0);  // 1024 tokens: 1 s
    const HitPlan p = plan_hit(input(ram, 0), m, HitPolicy::kCost);
    EXPECT_EQ(p.compute_blocks, computes ? 64u : 0u)
        << "load " << *p.load_only << " s, compute " << *p.compute_only;
  }
}

// Side by side, a front and a load run slower than each alone; splits that took longer than
// predicted raise the model's overlap factor until a split no longer looks worth it.
TEST(HitPlannerTest, SplitsThatRanSlowerThanPredictedStopBeingChosen) {
  const std::vector<int> ssd(64, 2);
  Costs c(20, 1, 15e3);  // load 67 ms, compute 68 ms: a split predicted at about half
  const HitPlan before = plan_hit(input(ssd), c.model, HitPolicy::kCost);
  ASSERT_TRUE(before.compute_blocks > 0 && before.compute_blocks < 64 && before.overlap_alone);
  EXPECT_DOUBLE_EQ(c.model.overlap_factor(), 1.0);
  for (int i = 0; i < 5; ++i)
    c.model.observe_overlap(*before.overlap_alone, 2.5 * *before.overlap_alone);
  EXPECT_GT(c.model.overlap_factor(), 2.0);
  const HitPlan after = plan_hit(input(ssd), c.model, HitPolicy::kCost);
  EXPECT_EQ(after.compute_blocks, 64u) << "load 67 ms does not beat compute 68 by 10 %: compute";
  EXPECT_FALSE(after.overlap_alone);
}

// A tier believed slow is never loaded from, so its estimate would never be corrected: every
// probe_after-th plan in a row that computes its blocks loads them instead, to time it again.
TEST(HitPlannerTest, ATierWhoseBlocksKeepBeingComputedIsProbedWithAPureLoad) {
  const std::vector<int> blocks{1, 2, 2, 2};  // RAM, then SSD
  Costs c(20, 0.001, 1e6);  // the SSD believed at 1 MB/s: 3 MiB in 3 s against 80 tokens in 0.08 ms
  HitPlanInput in = input(blocks);
  in.probe_after = 3;
  for (int i = 0; i < 2; ++i) {
    const HitPlan p = plan_hit(in, c.model, HitPolicy::kCost);
    EXPECT_EQ(p.compute_blocks, 4u) << "plan " << i;
    EXPECT_FALSE(p.probe) << "plan " << i;
    c.model.note_unloaded(1);
    c.model.note_unloaded(2);
  }
  const HitPlan probe = plan_hit(in, c.model, HitPolicy::kCost);
  EXPECT_TRUE(probe.probe);
  EXPECT_EQ(probe.probe_tier, 2u) << "the slowest tier it probes";
  EXPECT_EQ(probe.compute_blocks, 0u) << "a probe loads everything: only a pure load is timed";
  EXPECT_FALSE(plan_hit(in, c.model, HitPolicy::kCompute).probe) << "only the cost policy probes";
  in.probe_after = 0;
  EXPECT_FALSE(plan_hit(in, c.model, HitPolicy::kCost).probe) << "0: never";

  // Reported, the count starts over; a restore in line with the estimate leaves the next plans
  // computing.
  in.probe_after = 3;
  c.model.note_probe(2);
  c.model.note_probe(1);
  EXPECT_EQ(c.model.probes(2), 1u);
  c.model.observe_restore(2, 3ull << 20, 3.0);
  EXPECT_FALSE(plan_hit(in, c.model, HitPolicy::kCost).probe);
  // That probe found the estimate right: the next one waits twice as long (6 plans, not 3).
  for (int i = 0; i < 4; ++i) c.model.note_unloaded(2);
  EXPECT_FALSE(plan_hit(in, c.model, HitPolicy::kCost).probe) << "the 5th plan of 6";
  c.model.note_unloaded(2);
  EXPECT_TRUE(plan_hit(in, c.model, HitPolicy::kCost).probe) << "the 6th";
}

// A probe that finds the tier far faster than believed asks for another at once, and two such
// restores in a row replace the tier's estimate: with the default decay, old samples would
// outweigh new ones for dozens of restores, and a tier believed slow is loaded only by probes.
// A fit learnt while the GPU ran slow (a freshly started one, calibrated in its first seconds)
// must come down when prefills run fast: two in a row under a third of the estimate scale it.
// One alone is kept as a sample, not trusted as a new speed.
TEST(HitCostModelTest, TwoPrefillsInARowFarBelowTheEstimateScaleItDown) {
  HitCostModel m;
  auto cost = [](double t, double ctx) { return 0.0003 + 1e-6 * t + 1e-10 * t * (ctx + t / 2); };
  for (auto [t, ctx] :
       {std::pair{64, 0}, {1024, 0}, {1024, 1024}, {64, 0}, {1024, 0}, {1024, 1024}})
    m.observe_prefill(t, ctx, 8 * cost(t, ctx));  // calibrated slow
  EXPECT_NEAR(*m.prefill_seconds(2048, 0), 8 * cost(2048, 0), 1e-9);
  m.observe_prefill(2048, 0, cost(2048, 0));
  EXPECT_GT(*m.prefill_seconds(2048, 0), 2 * cost(2048, 0))
      << "one fast prefill is not a new speed";
  m.observe_prefill(2048, 0, cost(2048, 0));
  EXPECT_LT(*m.prefill_seconds(2048, 0), 1.5 * cost(2048, 0));
  EXPECT_LT(*m.prefill_seconds(8192, 8192), 1.5 * cost(8192, 8192)) << "the fit's shape is kept";
  EXPECT_GT(*m.prefill_seconds(8192, 8192), 0.5 * cost(8192, 8192));
}

TEST(HitCostModelTest, TwoRestoresInARowFarBelowTheEstimateReplaceIt) {
  const std::vector<int> ssd(4, 2);
  Costs c(20, 0.001, 1e6);
  HitPlanInput in = input(ssd);
  in.probe_after = 32;
  EXPECT_FALSE(plan_hit(in, c.model, HitPolicy::kCost).probe);
  c.model.observe_restore(2, 4ull << 20, 0.002);  // 2 ms for what was believed to take 4 s
  EXPECT_TRUE(plan_hit(in, c.model, HitPolicy::kCost).probe) << "far below: probe again at once";
  EXPECT_GT(*c.model.restore_seconds(2, 4ull << 20), 1.0)
      << "one fast restore is not yet a faster machine";
  c.model.observe_restore(2, 4ull << 20, 0.002);
  EXPECT_NEAR(*c.model.restore_seconds(2, 4ull << 20), 0.002, 1e-9);
  const HitPlan after = plan_hit(in, c.model, HitPolicy::kCost);
  EXPECT_FALSE(after.probe);
  EXPECT_EQ(after.compute_blocks, 4u) << "2 ms still loses to 0.08 ms of compute";

  // One fast restore between ordinary ones is only a sample.
  HitCostModel m;
  m.observe_restore(1, 8ull << 20, 0.010);  // warm-up
  for (int i = 0; i < 3; ++i) m.observe_restore(1, 8ull << 20, 0.010);
  m.observe_restore(1, 8ull << 20, 0.001);
  m.observe_restore(1, 8ull << 20, 0.010);
  EXPECT_GT(*m.restore_seconds(1, 8ull << 20), 0.007);
}

// The overlap factor has the same trap: once splits ran slow, none is chosen, so none is timed
// again. A split that would win at factor 1 is tried every probe_after-th plan that passes it
// over; one that runs well asks for the next try at once, one that runs slow doubles the wait.
TEST(HitPlannerTest, ASplitPassedOverForTheOverlapFactorIsTriedNowAndThen) {
  const std::vector<int> ssd(64, 2);
  HitPlanInput in = input(ssd);
  in.probe_after = 3;
  auto slowed = [&](Costs& c) {
    const HitPlan first = plan_hit(in, c.model, HitPolicy::kCost);
    for (int i = 0; i < 5; ++i)
      c.model.observe_overlap(*first.overlap_alone, 2.5 * *first.overlap_alone);
  };
  auto pass_over_twice = [&](Costs& c, int plans) {
    for (int i = 0; i < plans; ++i) {
      const HitPlan p = plan_hit(in, c.model, HitPolicy::kCost);
      EXPECT_EQ(p.compute_blocks, 64u) << "plan " << i;
      EXPECT_TRUE(p.split_passed_over) << "plan " << i;
      EXPECT_FALSE(p.split_probe) << "plan " << i;
      c.model.note_unsplit();
    }
  };
  Costs good(20, 1, 15e3);  // load 67 ms, compute 68 ms: a split predicted at about half
  slowed(good);
  pass_over_twice(good, 2);
  HitPlan p = plan_hit(in, good.model, HitPolicy::kCost);
  ASSERT_TRUE(p.split_probe);
  EXPECT_TRUE(p.compute_blocks > 0 && p.compute_blocks < 64);
  int tries = 0;
  while (p.split_probe && tries < 10) {  // each try runs as predicted alone
    good.model.note_split_probe();
    ++tries;
    good.model.observe_overlap(*p.overlap_alone, *p.overlap_alone);
    p = plan_hit(in, good.model, HitPolicy::kCost);
  }
  EXPECT_LE(tries, 4) << "each good try asks for the next at once";
  EXPECT_TRUE(p.compute_blocks > 0 && p.compute_blocks < 64) << "then plans split on their own";
  EXPECT_EQ(good.model.split_probes(), static_cast<uint64_t>(tries));

  Costs bad(20, 1, 15e3);
  slowed(bad);
  pass_over_twice(bad, 2);
  p = plan_hit(in, bad.model, HitPolicy::kCost);
  ASSERT_TRUE(p.split_probe);
  bad.model.note_split_probe();
  bad.model.observe_overlap(*p.overlap_alone, 2.5 * *p.overlap_alone);
  pass_over_twice(bad, 5);
  EXPECT_TRUE(plan_hit(in, bad.model, HitPolicy::kCost).split_probe) << "after 6 plans, not 3";
  in.probe_after = 0;
  EXPECT_FALSE(plan_hit(in, bad.model, HitPolicy::kCost).split_probe) << "0: never";
}

TEST(HitPlannerTest, PoliciesForceTheirEnds) {
  const std::vector<int> ram(16, 1);
  Costs c(20, 1, 15e3);
  EXPECT_EQ(plan_hit(input(ram), c.model, HitPolicy::kLoad).compute_blocks, 0u);
  EXPECT_EQ(plan_hit(input(ram), c.model, HitPolicy::kCompute).compute_blocks, 16u);
  EXPECT_EQ(*parse_hit_policy("cost"), HitPolicy::kCost);
  EXPECT_FALSE(parse_hit_policy("fastest").ok());
}

}  // namespace
}  // namespace kvtier
