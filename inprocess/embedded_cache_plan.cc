// EmbeddedCache's lookups and hit plans for the engine (cache/plan/engine_planner.h): what a plan
// is made of — the cached prefix's tiers, the engine's prefill times, kvtier's own timings of whole
// loads — and the calls that teach it.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "inprocess/embedded_cache.h"
#include "inprocess/embedded_cache_impl.h"

namespace kvtier {

Result<PrefixMatch> EmbeddedCache::lookup(const Prompt& prompt) {
  KVTIER_ASSIGN_OR_RETURN(auto call, enter(prompt));
  LookupResult found;
  if (impl_->hybrid) {
    const HybridLookup h =
        impl_->hybrid->lookup(impl_->prompt_keys(prompt.tokens, prompt.extra_keys));
    found.matched_tokens = h.matched_tokens;
    found.blocks = h.hits;
  } else {
    found = impl_->cache().lookup(impl_->prompt_keys(prompt.tokens, prompt.extra_keys),
                                  prompt.tokens.size());
  }
  return impl_->cache().describe(found, impl_->layout().dense_block_bytes());
}

void EmbeddedCache::Impl::time_load(const LoadReport& r, double seconds) {
  if (r.first_block != 0 || r.deadline_passed || r.loaded_blocks == 0 || r.source_tier < 0) return;
  planner.observe_load(static_cast<size_t>(r.source_tier),
                       r.loaded_blocks * layout().dense_block_bytes(), seconds);
}

Result<PlanPolicy> parse_plan_policy(std::string_view name) {
  KVTIER_ASSIGN_OR_RETURN(HitPolicy p, parse_hit_policy(name));
  return p == HitPolicy::kLoad      ? PlanPolicy::kLoad
         : p == HitPolicy::kCompute ? PlanPolicy::kCompute
                                    : PlanPolicy::kCost;
}

Result<PrefillPlan> EmbeddedCache::plan_prefill(const Prompt& prompt, PlanPolicy policy) {
  KVTIER_ASSIGN_OR_RETURN(auto call, enter(prompt));
  if (Status st = check_extra_keys(prompt.extra_keys); !st.ok()) return impl_->reject(st);
  const uint32_t bs = static_cast<uint32_t>(layout().block_size);
  std::vector<BlockKey> keys = impl_->loadable_keys(prompt.tokens, prompt.extra_keys);
  // The last token is always computed: its logits start the generation.
  keys.resize(std::min(keys.size(), prompt.tokens.empty() ? 0 : (prompt.tokens.size() - 1) / bs));
  const LookupResult found = impl_->cache().lookup(keys);
  std::vector<int> tiers;
  tiers.reserve(found.blocks.size());
  for (const auto& h : found.blocks) tiers.push_back(h.tier);
  const uint64_t uncached = prompt.tokens.size() - tiers.size() * bs;
  const HitPolicy p = policy == PlanPolicy::kLoad      ? HitPolicy::kLoad
                      : policy == PlanPolicy::kCompute ? HitPolicy::kCompute
                                                       : HitPolicy::kCost;
  const EnginePlan e = impl_->planner.plan(tiers, layout().dense_block_bytes(), bs, uncached,
                                           impl_->cache().costs(), p);
  PrefillPlan out;
  out.cached_blocks = e.hit.cached_blocks;
  out.compute_blocks = e.hit.compute_blocks;
  out.predicted = e.hit.predicted;
  out.load_only = e.hit.load_only;
  out.compute_only = e.hit.compute_only;
  out.load_seconds = e.hit.load_seconds;
  out.deadline = e.deadline;
  out.probe = e.hit.probe || e.hit.split_probe;
  out.overlap_alone = e.hit.overlap_alone;
  return out;
}

Status EmbeddedCache::observe_prefill(uint64_t tokens, uint64_t context, double seconds) {
  KVTIER_ASSIGN_OR_RETURN(auto call, enter());
  if (tokens == 0 || !(seconds > 0) || !std::isfinite(seconds)) {
    return impl_->reject(
        invalid_argument("a prefill sample needs tokens > 0 and seconds > 0, got " +
                         std::to_string(tokens) + " tokens in " + std::to_string(seconds) + " s"));
  }
  impl_->planner.observe_prefill(tokens, context, seconds);
  return ok_status();
}

Status EmbeddedCache::observe_load(const LoadReport& report, double seconds) {
  KVTIER_ASSIGN_OR_RETURN(auto call, enter());
  if (!(seconds > 0) || !std::isfinite(seconds)) {
    return impl_->reject(
        invalid_argument("a load's time must be > 0 seconds, got " + std::to_string(seconds)));
  }
  impl_->time_load(report, seconds);
  return ok_status();
}

Status EmbeddedCache::observe_split(const PrefillPlan& plan, double seconds) {
  KVTIER_ASSIGN_OR_RETURN(auto call, enter());
  if (!(seconds > 0) || !std::isfinite(seconds)) {
    return impl_->reject(
        invalid_argument("a split's time must be > 0 seconds, got " + std::to_string(seconds)));
  }
  HitPlan h;
  h.cached_blocks = plan.cached_blocks;
  h.compute_blocks = plan.compute_blocks;
  h.overlap_alone = plan.overlap_alone;
  impl_->planner.observe_split(h, seconds);
  return ok_status();
}

}  // namespace kvtier
