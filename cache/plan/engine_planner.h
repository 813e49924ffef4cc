// EnginePlanner: hit plans for an engine kvtier does not run — a CUDA engine that reaches kvtier
// through the Python module or the C ABI. The engine tells it what its prefills take; kvtier times
// its own loads into the engine's memory; a plan says how much of a cached prefix to compute
// while the rest loads, and how long to wait for the load before computing what is missing.
//
// The engine's memory is not one of kvtier's tiers, so every cached block has to travel: the
// planner's tier t + 1 is kvtier's tier t (RAM, SSD, ...) brought all the way into the engine's
// memory, and its tier 0 (free blocks, HitPlan::gpu_blocks) is never used. Each is learned from
// whole loads, end to end (kvtier's own restore into RAM, the bus, the engine's scatter); a tier
// below RAM whose loads have not been timed yet is estimated as RAM's load plus kvtier's own
// restore from it, which every fetch teaches. Loads overlap the engine's compute: they run on
// kvtier's threads and copy engines, not on the engine's stream.
// Thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "cache/plan/hit_cost_model.h"
#include "cache/plan/hit_planner.h"

namespace kvtier {

struct EnginePlan {
  // Blocks as the engine's prompt numbers them: compute [0, hit.compute_blocks), load
  // [compute_blocks, cached_blocks), then compute the rest of the prompt. gpu_blocks is 0.
  HitPlan hit;
  // Seconds from the load's start the engine waits for it at most; what is not in by then it
  // computes (a partial load keeps what arrived in order). nullopt: no load, or no estimate.
  std::optional<double> deadline;
};

class EnginePlanner {
 public:
  EnginePlanner() = default;

  // The engine computed `tokens` rows after `context` cached ones in `seconds`.
  void observe_prefill(uint64_t tokens, uint64_t context, double seconds);
  // A pure load (nothing computed beside it) of `bytes` into the engine's memory, its slowest
  // block from kvtier's tier `tier`, took `seconds` from the call until the bytes were there.
  void observe_load(size_t tier, uint64_t bytes, double seconds);
  // A split plan's front and back, side by side, took `seconds` until both were done: teaches the
  // overlap factor (HitCostModel::observe_overlap). Ignored for a plan that did not split.
  void observe_split(const HitPlan& plan, double seconds);

  // `block_tiers`: kvtier's tier of each block of the cached prefix (0 = its top tier);
  // `uncached_tokens` follow it whatever the plan. `kvtier` is the cache's own restore model.
  // kCost plans are recorded, so that a tier whose blocks keep being computed is loaded now and
  // then to time it again (HitPlanInput::probe_after).
  EnginePlan plan(std::span<const int> block_tiers, uint64_t block_bytes, uint32_t block_size,
                  uint64_t uncached_tokens, const HitCostModel& kvtier, HitPolicy policy);

  const HitCostModel& model() const { return model_; }
  // For tests and benchmarks: rates stated, as if observed. Tier as kvtier numbers it.
  void set_load(size_t tier, double fixed_seconds, double bytes_per_second);
  void set_prefill(double fixed_seconds, double seconds_per_token, double seconds_per_token_pair);

  // As kvtier's own generator: a load is waited for until max(kDeadlineFactor x its prediction,
  // the predicted recompute) + kDeadlineSlack (a probe only until the recompute).
  static constexpr double kDeadlineFactor = 2.0;
  static constexpr double kDeadlineSlack = 0.002;
  static constexpr size_t kProbeAfter = 32;

 private:
  HitCostModel model_;  // restore index t + 1: kvtier's tier t, into the engine's memory
};

}  // namespace kvtier
