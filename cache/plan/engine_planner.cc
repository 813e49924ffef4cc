#include "cache/plan/engine_planner.h"

#include <algorithm>
#include <vector>

namespace kvtier {

void EnginePlanner::observe_prefill(uint64_t tokens, uint64_t context, double seconds) {
  model_.observe_prefill(tokens, context, seconds);
}

void EnginePlanner::observe_load(size_t tier, uint64_t bytes, double seconds) {
  if (tier + 1 < kMaxTiers) model_.observe_restore(tier + 1, bytes, seconds);
}

void EnginePlanner::observe_split(const HitPlan& plan, double seconds) {
  const bool split =
      plan.compute_blocks > plan.gpu_blocks && plan.compute_blocks < plan.cached_blocks;
  if (split && plan.overlap_alone) model_.observe_overlap(*plan.overlap_alone, seconds);
}

EnginePlan EnginePlanner::plan(std::span<const int> block_tiers, uint64_t block_bytes,
                               uint32_t block_size, uint64_t uncached_tokens,
                               const HitCostModel& kvtier, HitPolicy policy) {
  std::vector<int> tiers(block_tiers.size());
  std::transform(block_tiers.begin(), block_tiers.end(), tiers.begin(),
                 [](int t) { return t + 1; });
  HitCostModel::Snapshot costs = model_.snapshot();
  const HitCostModel::Snapshot own = kvtier.snapshot();
  // A tier below RAM not timed end to end yet: RAM's load plus kvtier's restore from it. Both are
  // a fixed cost plus seconds per MiB, so their sum is one too.
  for (size_t t = 2; t < kMaxTiers; ++t) {
    if (costs.restore[t] || !costs.restore[1] || !own.restore[t - 1]) continue;
    costs.restore[t] = std::array<double, 2>{(*costs.restore[1])[0] + (*own.restore[t - 1])[0],
                                             (*costs.restore[1])[1] + (*own.restore[t - 1])[1]};
  }
  HitPlanInput input{tiers, block_bytes, block_size, uncached_tokens, {}};
  input.overlaps_compute.fill(true);
  input.probe_after = kProbeAfter;
  EnginePlan out;
  out.hit = plan_hit(input, costs, policy);
  if (policy == HitPolicy::kCost) record_plan(model_, out.hit, tiers);
  const HitPlan& p = out.hit;
  if (p.compute_blocks < p.cached_blocks && p.load_seconds) {
    const double wait = p.probe && p.compute_only ? *p.compute_only
                                                  : std::max(kDeadlineFactor * *p.load_seconds,
                                                             p.compute_only.value_or(0.0));
    out.deadline = wait + kDeadlineSlack;
  }
  return out;
}

void EnginePlanner::set_load(size_t tier, double fixed_seconds, double bytes_per_second) {
  if (tier + 1 < kMaxTiers) model_.set_restore(tier + 1, fixed_seconds, bytes_per_second);
}

void EnginePlanner::set_prefill(double fixed_seconds, double seconds_per_token,
                                double seconds_per_token_pair) {
  model_.set_prefill(fixed_seconds, seconds_per_token, seconds_per_token_pair);
}

}  // namespace kvtier
