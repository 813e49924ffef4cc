#include "cache/hit_planner.h"

#include <algorithm>
#include <array>

namespace kvtier {

Result<HitPolicy> parse_hit_policy(std::string_view name) {
  if (name == "cost") return HitPolicy::kCost;
  if (name == "load") return HitPolicy::kLoad;
  if (name == "compute") return HitPolicy::kCompute;
  return invalid_argument("hit policy '" + std::string(name) + "' is not cost, load or compute");
}

const char* hit_policy_name(HitPolicy policy) {
  switch (policy) {
    case HitPolicy::kCost: return "cost";
    case HitPolicy::kLoad: return "load";
    case HitPolicy::kCompute: return "compute";
  }
  return "?";
}

namespace {

// Seconds to load blocks [from, to): each tier involved pays its fixed cost once and its rate for
// its bytes; tiers are read one after another (a conservative sum).
std::optional<double> load_time(const HitPlanInput& in, const HitCostModel& costs, size_t from, size_t to) {
  std::array<uint64_t, kMaxTiers> bytes{};
  for (size_t i = from; i < to; ++i) {
    const int t = in.block_tiers[i];
    if (t > 0 && static_cast<size_t>(t) < kMaxTiers) bytes[t] += in.block_bytes;
  }
  double total = 0;
  for (size_t t = 1; t < kMaxTiers; ++t) {
    if (bytes[t] == 0) continue;
    const auto s = costs.restore_seconds(t, bytes[t]);
    if (!s) return std::nullopt;
    total += *s;
  }
  return total;
}

}  // namespace

HitPlan plan_hit(const HitPlanInput& in, const HitCostModel& costs, HitPolicy policy) {
  HitPlan plan;
  plan.cached_blocks = in.block_tiers.size();
  while (plan.gpu_blocks < plan.cached_blocks && in.block_tiers[plan.gpu_blocks] == 0) ++plan.gpu_blocks;
  const size_t g = plan.gpu_blocks, n = plan.cached_blocks;
  const uint64_t bs = in.block_size;
  const auto rest = costs.prefill_seconds(in.uncached_tokens, n * bs);
  // Predicted time to the first token when blocks [g, s) are computed while [s, n) load.
  auto predict = [&](size_t s) -> std::optional<double> {
    const auto front = costs.prefill_seconds((s - g) * bs, g * bs);
    const auto load = load_time(in, costs, s, n);
    if (!front || !load || !rest) return std::nullopt;
    return std::max(*front, *load) + *rest;
  };
  plan.load_only = predict(g);
  plan.compute_only = predict(n);
  size_t s = g;
  if (policy == HitPolicy::kCompute) {
    s = n;
  } else if (policy == HitPolicy::kCost && plan.load_only && plan.compute_only) {
    // The front's compute grows and the back's load shrinks with s: scan every split (a prefix
    // is at most a few thousand blocks, and each step is two fits' arithmetic). Ties keep the
    // smaller s: loading leaves the GPU free for other sequences.
    double best = *plan.load_only;
    for (size_t k = g + 1; k <= n; ++k) {
      const auto t = predict(k);
      if (t && *t < best) {
        best = *t;
        s = k;
      }
    }
  }
  plan.compute_blocks = s;
  plan.predicted = predict(s);
  plan.load_seconds = load_time(in, costs, s, n);
  return plan;
}

}  // namespace kvtier
