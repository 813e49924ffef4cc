#include "cache/plan/hit_planner.h"

#include <algorithm>
#include <array>
#include <vector>

namespace kvtier {

Result<HitPolicy> parse_hit_policy(std::string_view name) {
  if (name == "cost") return HitPolicy::kCost;
  if (name == "load") return HitPolicy::kLoad;
  if (name == "compute") return HitPolicy::kCompute;
  return invalid_argument("hit policy '" + std::string(name) + "' is not cost, load or compute");
}

const char* hit_policy_name(HitPolicy policy) {
  switch (policy) {
    case HitPolicy::kCost:
      return "cost";
    case HitPolicy::kLoad:
      return "load";
    case HitPolicy::kCompute:
      return "compute";
  }
  return "?";
}

HitPlan plan_hit(const HitPlanInput& in, const HitCostModel& model, HitPolicy policy) {
  return plan_hit(in, model.snapshot(), policy);
}

void record_plan(HitCostModel& costs, const HitPlan& plan, std::span<const int> block_tiers) {
  if (plan.split_probe) {
    costs.note_split_probe();
  } else if (plan.split_passed_over) {
    costs.note_unsplit();
  }
  if (plan.probe) {
    costs.note_probe(plan.probe_tier);
    return;
  }
  std::array<bool, kMaxTiers> unloaded{};
  for (size_t i = plan.gpu_blocks; i < plan.compute_blocks && i < block_tiers.size(); ++i) {
    const int t = block_tiers[i];
    if (t > 0 && static_cast<size_t>(t) < kMaxTiers) unloaded[t] = true;
  }
  for (size_t t = 1; t < kMaxTiers; ++t) {
    if (unloaded[t]) costs.note_unloaded(t);
  }
}

HitPlan plan_hit(const HitPlanInput& in, const HitCostModel::Snapshot& costs, HitPolicy policy) {
  HitPlan plan;
  plan.cached_blocks = in.block_tiers.size();
  while (plan.gpu_blocks < plan.cached_blocks && in.block_tiers[plan.gpu_blocks] == 0)
    ++plan.gpu_blocks;
  const size_t g = plan.gpu_blocks, n = plan.cached_blocks;
  const uint64_t bs = in.block_size;
  // Bytes of blocks [s, n) in each tier, for every s: each split's load in O(tiers).
  std::vector<std::array<uint64_t, kMaxTiers>> suffix(n + 1);
  for (size_t i = n; i-- > g;) {
    suffix[i] = suffix[i + 1];
    const int t = in.block_tiers[i];
    if (t > 0 && static_cast<size_t>(t) < kMaxTiers) suffix[i][t] += in.block_bytes;
  }
  // Whose estimate each tier's blocks take: its own, else the nearest slower tier's (see the
  // header); kMaxTiers where none is known.
  std::array<size_t, kMaxTiers> pace{};
  for (size_t t = kMaxTiers; t-- > 0;) {
    pace[t] = costs.restore[t] ? t : (t + 1 < kMaxTiers ? pace[t + 1] : kMaxTiers);
  }
  // Seconds of the load of [s, n): the part that runs beside compute, and the part after it.
  auto load = [&](size_t s) -> std::optional<std::pair<double, double>> {
    std::pair<double, double> out{0, 0};
    for (size_t t = 1; t < kMaxTiers; ++t) {
      if (suffix[s][t] == 0) continue;
      if (pace[t] == kMaxTiers) return std::nullopt;
      const auto sec = costs.restore_seconds(pace[t], suffix[s][t]);
      if (!sec) return std::nullopt;
      (in.overlaps_compute[t] ? out.first : out.second) += *sec;
    }
    return out;
  };
  const auto rest = costs.prefill_seconds(in.uncached_tokens, n * bs);
  // The front [g, s) computed beside the overlapping part `beside` of the load of [s, n), each
  // alone: the longer of the two.
  auto alone = [&](size_t s, double beside) -> std::optional<double> {
    const auto front = costs.prefill_seconds((s - g) * bs, g * bs);
    if (!front) return std::nullopt;
    return std::max(*front, beside);
  };
  // Predicted time to the first token when blocks [g, s) are computed while [s, n) load. Side by
  // side they run slower than alone: by the overlap factor the model learned from past splits.
  auto predict_at = [&](size_t s, double overlap) -> std::optional<double> {
    if (s == n) return costs.prefill_seconds((n - g) * bs + in.uncached_tokens, g * bs);
    const auto l = load(s);
    if (!l || !rest) return std::nullopt;
    const auto both = alone(s, l->first);
    if (!both) return std::nullopt;
    return (s > g ? overlap : 1.0) * *both + l->second + *rest;
  };
  auto predict = [&](size_t s) { return predict_at(s, costs.overlap); };
  plan.load_only = predict(g);
  plan.compute_only = predict(n);
  size_t s = g;
  if (policy == HitPolicy::kCompute) {
    s = n;
  } else if (policy == HitPolicy::kCost && plan.load_only && plan.compute_only) {
    // Ties keep the smaller s: loading leaves the GPU free for other sequences.
    double best = *plan.load_only;
    for (size_t k = g + 1; k <= n; ++k) {
      const auto t = predict(k);
      if (t && *t < best) {
        best = *t;
        s = k;
      }
    }
    if (s < n && best > (1.0 - in.min_gain) * *plan.compute_only)
      s = n;  // too close to call: compute
    // A tier whose blocks keep being computed on its own estimate is loaded once to time it
    // again (the slowest such tier named): otherwise an estimate gone high is never corrected.
    if (in.probe_after > 0) {
      for (size_t i = g; i < s; ++i) {
        const int t = in.block_tiers[i];
        if (t <= 0 || static_cast<size_t>(t) >= kMaxTiers || !costs.restore[t]) continue;
        if (costs.probe_now[t] ||
            costs.unloaded[t] + 1 >=
                in.probe_after * std::max<uint64_t>(1, costs.probe_backoff[t])) {
          plan.probe = true;
          plan.probe_tier = std::max(plan.probe_tier, static_cast<size_t>(t));
        }
      }
      if (plan.probe) s = g;
    }
    // Likewise a split that would win were the overlap factor 1, passed over because splits ran
    // slow before: now and then it is tried, to time the overlap again.
    if (in.probe_after > 0 && !plan.probe && costs.overlap > 1.0 && (s == g || s == n)) {
      const double chosen = s == n ? *plan.compute_only : *plan.load_only;
      size_t k1 = n;
      double t1 = chosen;
      for (size_t k = g + 1; k < n; ++k) {
        const auto t = predict_at(k, 1.0);
        if (t && *t < t1) {
          t1 = *t;
          k1 = k;
        }
      }
      if (k1 < n && t1 < (1.0 - in.min_gain) * chosen) {
        if (costs.split_probe_now ||
            costs.unsplit + 1 >= in.probe_after * std::max<uint64_t>(1, costs.split_backoff)) {
          plan.split_probe = true;
          s = k1;
        } else {
          plan.split_passed_over = true;
        }
      }
    }
  }
  plan.compute_blocks = s;
  plan.predicted = predict(s);
  if (const auto l = load(s)) {
    plan.load_seconds = l->first + l->second;
    if (s > g && s < n) plan.overlap_alone = alone(s, l->first);
  }
  return plan;
}

}  // namespace kvtier
