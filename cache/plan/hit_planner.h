// HitPlanner: how to bring a cached prefix to the GPU — by loading it, recomputing it, or both at
// once. Computing uses the GPU's arithmetic, loading the disk and the bus, so they overlap: the
// plan computes the prefix's first blocks while its last ones load, and meets in the middle
// ("Compute Or Load KV Cache? Why Not Both?", Jin et al. 2024). Blocks already on the GPU are
// always used; a split point s in [gpu_blocks, cached_blocks] says "compute up to block s, load
// the rest", so s = gpu_blocks is a pure load and s = cached_blocks a pure recompute. Computed and
// restored KV are the same bits (the parity contract), so the plan changes only the time.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "base/status.h"
#include "cache/plan/hit_cost_model.h"

namespace kvtier {

enum class HitPolicy {
  kCost,     // the split with the least predicted time to the first token
  kLoad,     // load every cached block (compute only what is not cached)
  kCompute,  // recompute every cached block not already on the GPU
};
Result<HitPolicy> parse_hit_policy(std::string_view name);  // "cost", "load", "compute"
const char* hit_policy_name(HitPolicy policy);

struct HitPlanInput {
  std::span<const int> block_tiers;  // the cached prefix: each block's tier (0 = the GPU tier)
  uint64_t block_bytes = 0;
  uint32_t block_size = 16;      // tokens per block
  uint64_t uncached_tokens = 0;  // computed after the prefix whatever the plan
  // Tiers whose loads proceed while the GPU computes: those that wait on a disk or the network.
  // A load from memory is counted after the front, not beside it: it is mostly CPU work and its
  // upload, and although uploads now run on a lane of their own, a RAM load overlapping a
  // computed front has not been measured (the plan tables' RAM rows pick pure loads).
  std::array<bool, kMaxTiers> overlaps_compute{};
  // kCost loads anything only where that is predicted to beat recomputing by this fraction. The
  // predictions miss by up to ~30 % (docs/benchmarks.md, hit plans), and they miss in one
  // direction more: a split's second launch and a load's contention with compute are not in the
  // model. H100, the tiny model, 8192 tokens from the SSD: a split predicted to beat recomputing
  // (8.5 ms) took 9.8. Recomputing when a load would have won by less costs at most this fraction.
  double min_gain = 0.1;
  // kCost: the probe_after-th plan in a row that would compute blocks of a tier with an estimate
  // of its own (the earlier ones counted by HitCostModel::note_unloaded), or the first after that
  // tier's restore came in far below its estimate, is a probe: it loads every cached block, to
  // time the tier again. 0: never. Each probe that found the tier's estimate right doubles the
  // interval for that tier, up to 32 times (HitCostModel::Snapshot::probe_backoff). The same
  // interval, doubled the same way, applies to plans that pass over a split only because of the
  // overlap factor: the next one tries the split (HitPlan::split_probe).
  size_t probe_after = 0;
};

struct HitPlan {
  size_t gpu_blocks = 0;      // leading blocks already on the GPU: used as they are
  size_t compute_blocks = 0;  // s: blocks [gpu_blocks, s) computed while [s, cached) load
  size_t cached_blocks = 0;
  // Predicted seconds to the first token for this split, a pure load and a pure recompute; nullopt
  // where the cost model does not know yet.
  std::optional<double> predicted, load_only, compute_only;
  // Predicted seconds of the load of [s, cached) alone: the deadline is set from it.
  std::optional<double> load_seconds;
  // A split's front and the part of its load beside it, predicted each alone: the longer of the
  // two (what the cost model's overlap factor scales). Set only for a split.
  std::optional<double> overlap_alone;
  // A probe (see HitPlanInput::probe_after): a pure load where computing was predicted to win,
  // for the sake of `probe_tier`'s estimate. Its caller waits for it no longer than the predicted
  // recompute, and reports it (HitCostModel::note_probe).
  bool probe = false;
  size_t probe_tier = 0;
  // kCost with probe_after: a split that would win were the overlap factor 1 was passed over
  // (HitCostModel::note_unsplit), or is tried now to time the overlap again (a split probe,
  // HitCostModel::note_split_probe).
  bool split_passed_over = false;
  bool split_probe = false;
};

// The split `policy` asks for. kCost without estimates for every tier involved and the prefill
// falls back to a pure load. A tier no fetch has timed yet — every
// fetch that read from it read from a slower tier too, and was charged to that one — is estimated
// at the pace of the nearest slower tier that has been: not faster than it is. A split that
// computes every cached block is one prefill of them and the uncached rest together (no second
// launch). O(blocks).
HitPlan plan_hit(const HitPlanInput& input, const HitCostModel& costs, HitPolicy policy);
// The same from estimates taken (and perhaps combined) by the caller: an engine we do not run plans
// with its own prefill and load rates beside kvtier's restores (inprocess/prefill_planner.h).
HitPlan plan_hit(const HitPlanInput& input, const HitCostModel::Snapshot& costs, HitPolicy policy);
// Tells `costs` what a kCost plan decided, so the probes it schedules come round: a probe or a
// split probe taken, a split passed over, each tier whose blocks it computes (HitCostModel's
// note_* calls). `block_tiers` is the plan's input.
void record_plan(HitCostModel& costs, const HitPlan& plan, std::span<const int> block_tiers);

}  // namespace kvtier
