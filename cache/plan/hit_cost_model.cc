#include "cache/plan/hit_cost_model.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include <spdlog/spdlog.h>

namespace kvtier {
namespace {

// Inputs in units near 1, so the normal equations stay well conditioned: MiB, thousands of
// tokens, millions of token pairs.
constexpr double kMiB = 1 << 20;
constexpr double kKiloTokens = 1e3;
constexpr double kMegaPairs = 1e6;
// Each sample's weight shrinks by this per later sample: the last ~20 requests dominate.
constexpr double kDecay = 0.95;
// The overlap factor follows the last three or four splits: a plan repeats per request, so a
// split that lost should stop being chosen within a few requests, not twenty.
constexpr double kOverlapWeight = 0.3;
// A split probe whose time over its prediction came in this much under the overlap factor is
// news: the factor is coming down, so the next plan tries again.
constexpr double kSplitProbeMargin = 0.25;

std::array<double, 3> prefill_inputs(uint64_t tokens, uint64_t context) {
  const double t = static_cast<double>(tokens);
  return {1.0, t / kKiloTokens, t * (static_cast<double>(context) + t / 2) / kMegaPairs};
}

}  // namespace

template <size_t N>
void DecayingLeastSquares<N>::add(const std::array<double, N>& x, double y) {
  for (size_t i = 0; i < N; ++i) {
    for (size_t j = 0; j < N; ++j) xx_[i][j] = xx_[i][j] * decay_ + x[i] * x[j];
    xy_[i] = xy_[i] * decay_ + x[i] * y;
  }
  ++samples_;
}

template <size_t N>
std::optional<std::array<double, N>> DecayingLeastSquares<N>::fit() const {
  if (samples_ < N) return std::nullopt;
  std::array<std::array<double, N + 1>, N> m{};
  for (size_t i = 0; i < N; ++i) {
    for (size_t j = 0; j < N; ++j) m[i][j] = xx_[i][j];
    m[i][N] = xy_[i];
  }
  for (size_t c = 0; c < N; ++c) {  // Gaussian elimination, partial pivoting
    size_t pivot = c;
    for (size_t r = c + 1; r < N; ++r) {
      if (std::abs(m[r][c]) > std::abs(m[pivot][c])) pivot = r;
    }
    // Samples that did not vary in some input (every restore the same size) leave it undetermined.
    if (std::abs(m[pivot][c]) < 1e-9 * std::max(1.0, std::abs(xx_[c][c]))) return std::nullopt;
    std::swap(m[c], m[pivot]);
    for (size_t r = 0; r < N; ++r) {
      if (r == c) continue;
      const double f = m[r][c] / m[c][c];
      for (size_t k = c; k <= N; ++k) m[r][k] -= f * m[c][k];
    }
  }
  std::array<double, N> out{};
  for (size_t i = 0; i < N; ++i) out[i] = m[i][N] / m[i][i];
  return out;
}

template <size_t N>
std::optional<std::array<double, N>> DecayingLeastSquares<N>::fit_through_origin() const {
  // y ~ c[N-1] * x[N-1] alone (x[0] is the constant input).
  if (xx_[N - 1][N - 1] <= 0) return std::nullopt;
  std::array<double, N> out{};
  out[N - 1] = xy_[N - 1] / xx_[N - 1][N - 1];
  return out;
}

template class DecayingLeastSquares<2>;
template class DecayingLeastSquares<3>;

HitCostModel::HitCostModel()
    : restore_{DecayingLeastSquares<2>(kDecay), DecayingLeastSquares<2>(kDecay),
               DecayingLeastSquares<2>(kDecay), DecayingLeastSquares<2>(kDecay)},
      prefill_(kDecay) {
  probe_backoff_.fill(1);
}

namespace {

// A tier whose restores all had one size has no determined fixed cost: its rate then comes from a
// fit through the origin (the fixed cost folded into the rate), which holds near that size.
std::optional<std::array<double, 2>> restore_fit(const DecayingLeastSquares<2>& f) {
  if (auto c = f.fit()) return c;
  if (f.samples() == 0) return std::nullopt;
  return f.fit_through_origin();
}

// Coefficients below zero (noise on few samples) count as zero: an estimate is never less than
// what its positive terms say.
template <size_t N>
double evaluate(const std::array<double, N>& c, const std::array<double, N>& x) {
  double s = 0;
  for (size_t i = 0; i < N; ++i) s += std::max(0.0, c[i]) * x[i];
  return s;
}

}  // namespace

template <size_t N>
void HitCostModel::add_guarded(DecayingLeastSquares<N>& fit, Held<N>& held,
                               std::optional<double> estimate, const std::array<double, N>& x,
                               double y, uint64_t& dropped, const char* what) {
  const bool high = estimate && *estimate > 0 && y > kOutlierFactor * *estimate;
  if (high && !held.any) {
    held = {true, x, y, *estimate};
    return;
  }
  if (held.any) {
    if (high) {
      fit.add(held.x, held.y);  // two in a row: the machine is slower now
    } else {
      ++dropped;
      outlier_log_.info(
          "hit cost model: dropped a {} sample of {:.3f} ms, over {}x the estimate of {:.3f} ms, "
          "as a one-off",
          what, held.y * 1e3, kOutlierFactor, held.estimate * 1e3);
    }
    held.any = false;
  }
  fit.add(x, y);
}

void HitCostModel::observe_restore(size_t tier, uint64_t bytes, double seconds) {
  if (tier >= kMaxTiers || bytes == 0 || !(seconds >= 0)) return;
  std::lock_guard lock(mu_);
  if (!std::exchange(restore_warm_[tier], true)) return;
  const std::array<double, 2> x{1.0, static_cast<double>(bytes) / kMiB};
  std::optional<double> estimate;
  if (const auto c = restore_fit(restore_[tier])) estimate = evaluate(*c, x);
  unloaded_[tier] = 0;
  // Far below the estimate: the tier is faster than believed. Plans may have stopped loading
  // from it, so the next one probes again; a second such restore in a row starts the fit over
  // from the two (decay alone would take dozens of restores to forget the old rate, and plans
  // load from a tier they believe slow only when probing).
  const bool low = estimate && seconds * kOutlierFactor < *estimate;
  probe_now_[tier] = low;
  if (std::exchange(probing_[tier], false)) {
    probe_backoff_[tier] = low ? 1 : std::min(kMaxProbeBackoff, 2 * probe_backoff_[tier]);
  }
  Held<2>& prev = restore_low_[tier];
  if (low && prev.any) {
    probe_log_.info(
        "hit cost model: tier {} restored {:.3f} MiB in {:.3f} ms against an estimate of {:.3f} "
        "ms, "
        "the second restore in a row under a third of it: its estimate starts over",
        tier, x[1], seconds * 1e3, *estimate * 1e3);
    restore_[tier] = DecayingLeastSquares<2>(kDecay);
    restore_[tier].add(prev.x, prev.y);
    restore_[tier].add(x, seconds);
    restore_held_[tier].any = false;
    prev.any = false;
    probe_now_[tier] = false;  // the estimate is now these restores'
    return;
  }
  prev = {low, x, seconds, estimate.value_or(0)};
  add_guarded(restore_[tier], restore_held_[tier], estimate, x, seconds, restore_dropped_,
              "restore");
}

void HitCostModel::note_unloaded(size_t tier) {
  if (tier >= kMaxTiers) return;
  std::lock_guard lock(mu_);
  ++unloaded_[tier];
}

void HitCostModel::note_probe(size_t tier) {
  if (tier >= kMaxTiers) return;
  std::lock_guard lock(mu_);
  ++probes_[tier];
  unloaded_[tier] = 0;
  probe_now_[tier] = false;
  probing_[tier] = true;
}

uint64_t HitCostModel::probes(size_t tier) const {
  if (tier >= kMaxTiers) return 0;
  std::lock_guard lock(mu_);
  return probes_[tier];
}

void HitCostModel::observe_prefill(uint64_t tokens, uint64_t context, double seconds) {
  if (tokens == 0 || !(seconds >= 0)) return;
  std::lock_guard lock(mu_);
  const auto x = prefill_inputs(tokens, context);
  std::optional<double> estimate;
  if (const auto c = prefill_.fit()) estimate = evaluate(*c, x);
  const bool low = estimate && *estimate > 0 && seconds * kOutlierFactor < *estimate;
  if (low && prefill_low_.any) {
    // Scaled, not started over: three coefficients need three kinds of prefill, and a server
    // (or a benchmark) may see one prompt length for a long while. evaluate() is linear in a
    // positive factor, so the estimates at these two prefills become their geometric mean's.
    const double r = std::sqrt((prefill_low_.y / prefill_low_.estimate) * (seconds / *estimate));
    outlier_log_.info(
        "hit cost model: a prefill took {:.3f} ms against an estimate of {:.3f} ms, the second "
        "in a row under a third of it: the prefill estimates scaled by {:.3f}",
        seconds * 1e3, *estimate * 1e3, r);
    prefill_.scale(r);
    prefill_low_.any = false;  // (a held slow sample was settled by the first low one)
    prefill_.add(x, seconds);
    return;
  }
  prefill_low_ = low ? Held<3>{true, x, seconds, *estimate} : Held<3>{};
  add_guarded(prefill_, prefill_held_, estimate, x, seconds, prefill_dropped_, "prefill");
}

void HitCostModel::observe_overlap(double predicted, double seconds) {
  if (!(predicted > 0) || !(seconds >= 0)) return;
  // Bounded: one split that waited on something else (a disk's hiccup) moves plans a little, not
  // to never splitting again; a factor below 1 (overlap better than predicted) is allowed too.
  const double ratio = std::clamp(seconds / predicted, 0.5, 4.0);
  std::lock_guard lock(mu_);
  // A split tried to time the overlap (note_split_probe): one that ran well under the factor asks
  // for the next plan to try again (the factor comes down 30 % of the gap per split); one that
  // did not doubles the wait for the next try.
  if (std::exchange(split_probing_, false)) {
    split_probe_now_ = ratio < overlap_ - kSplitProbeMargin;
    split_backoff_ = split_probe_now_ ? 1 : std::min(kMaxProbeBackoff, 2 * split_backoff_);
  }
  unsplit_ = 0;
  overlap_ += kOverlapWeight * (ratio - overlap_);
}

void HitCostModel::note_unsplit() {
  std::lock_guard lock(mu_);
  ++unsplit_;
}

void HitCostModel::note_split_probe() {
  std::lock_guard lock(mu_);
  ++split_probes_;
  unsplit_ = 0;
  split_probe_now_ = false;
  split_probing_ = true;
}

uint64_t HitCostModel::split_probes() const {
  std::lock_guard lock(mu_);
  return split_probes_;
}

double HitCostModel::overlap_factor() const {
  std::lock_guard lock(mu_);
  return overlap_;
}

std::pair<uint64_t, uint64_t> HitCostModel::outliers_dropped() const {
  std::lock_guard lock(mu_);
  return {prefill_dropped_, restore_dropped_};
}

HitCostModel::Snapshot HitCostModel::snapshot() const {
  std::lock_guard lock(mu_);
  Snapshot s;
  for (size_t t = 0; t < kMaxTiers; ++t) s.restore[t] = restore_fit(restore_[t]);
  s.prefill = prefill_.fit();
  s.overlap = overlap_;
  s.unloaded = unloaded_;
  s.probe_now = probe_now_;
  s.probe_backoff = probe_backoff_;
  s.unsplit = unsplit_;
  s.split_probe_now = split_probe_now_;
  s.split_backoff = split_backoff_;
  return s;
}

std::optional<double> HitCostModel::Snapshot::restore_seconds(size_t tier, uint64_t bytes) const {
  if (tier >= kMaxTiers || !restore[tier]) return std::nullopt;
  const auto& c = *restore[tier];
  // A fit that came out negative somewhere (noise on few samples) still predicts no less than the
  // bytes at the fitted rate.
  return std::max(0.0, c[0]) + std::max(0.0, c[1]) * static_cast<double>(bytes) / kMiB;
}

std::optional<double> HitCostModel::Snapshot::prefill_seconds(uint64_t tokens,
                                                              uint64_t context) const {
  if (tokens == 0) return 0.0;
  if (!prefill) return std::nullopt;
  return evaluate(*prefill, prefill_inputs(tokens, context));
}

std::optional<double> HitCostModel::restore_seconds(size_t tier, uint64_t bytes) const {
  return snapshot().restore_seconds(tier, bytes);
}

std::optional<double> HitCostModel::prefill_seconds(uint64_t tokens, uint64_t context) const {
  return snapshot().prefill_seconds(tokens, context);
}

void HitCostModel::set_restore(size_t tier, double fixed_seconds, double bytes_per_second) {
  if (tier >= kMaxTiers || bytes_per_second <= 0) return;
  std::lock_guard lock(mu_);
  restore_warm_[tier] = true;
  restore_[tier] = DecayingLeastSquares<2>(kDecay);
  for (double mib : {1.0, 64.0}) {
    restore_[tier].add({1.0, mib}, fixed_seconds + mib * kMiB / bytes_per_second);
  }
}

void HitCostModel::set_prefill(double fixed_seconds, double seconds_per_token,
                               double seconds_per_token_pair) {
  std::lock_guard lock(mu_);
  prefill_ = DecayingLeastSquares<3>(kDecay);
  prefill_held_.any = false;
  prefill_low_.any = false;
  for (auto [t, ctx] : {std::pair<uint64_t, uint64_t>{16, 0}, {1024, 0}, {1024, 8192}}) {
    const double pairs =
        static_cast<double>(t) * (static_cast<double>(ctx) + static_cast<double>(t) / 2);
    prefill_.add(prefill_inputs(t, ctx), fixed_seconds +
                                             seconds_per_token * static_cast<double>(t) +
                                             seconds_per_token_pair * pairs);
  }
}

void HitCostModel::visit_metrics(MetricVisitor& v,
                                 const std::vector<std::string>& tier_names) const {
  std::lock_guard lock(mu_);
  for (const auto& [kind, n] : {std::pair<const char*, uint64_t>{"prefill", prefill_dropped_},
                                {"restore", restore_dropped_}}) {
    v.counter("kvtier_hit_cost_outliers_dropped_total",
              "Cost samples dropped as one-offs: over 3x the estimate, and the next sample was not",
              {{"kind", kind}}, n);
  }
  for (size_t t = 1; t < tier_names.size() && t < kMaxTiers; ++t) {
    v.counter("kvtier_hit_cost_probes_total",
              "Hit plans that loaded a tier's blocks only to time them: computing had won on its "
              "estimate for many plans, "
              "or its last restore came in far below it",
              {{"tier", tier_names[t]}}, probes_[t]);
  }
  for (size_t t = 0; t < tier_names.size() && t < kMaxTiers; ++t) {
    const auto c = restore_fit(restore_[t]);
    if (!c) continue;
    const MetricLabels tier{{"tier", tier_names[t]}};
    v.gauge("kvtier_hit_cost_restore_bytes_per_second",
            "Fitted restore rate of a tier into the top tier, from recent fetches", tier,
            (*c)[1] > 0 ? kMiB / (*c)[1] : 0.0);
    v.gauge("kvtier_hit_cost_restore_fixed_seconds", "Fitted fixed cost of one fetch from a tier",
            tier, std::max(0.0, (*c)[0]));
  }
  v.counter("kvtier_hit_cost_split_probes_total",
            "Split plans tried only to time the overlap: the overlap factor had ruled out a split "
            "that would win at 1",
            {}, split_probes_);
  v.gauge("kvtier_hit_cost_overlap_factor",
          "Recent split plans' time over their prediction (front and load each alone); scales the "
          "next plans'",
          {}, overlap_);
  if (const auto c = prefill_.fit()) {
    v.gauge("kvtier_hit_cost_prefill_seconds_per_token", "Fitted prefill cost per computed token",
            {}, std::max(0.0, (*c)[1]) / kKiloTokens);
    v.gauge("kvtier_hit_cost_prefill_seconds_per_token_pair",
            "Fitted prefill cost per (token, earlier token) pair: the attention's share", {},
            std::max(0.0, (*c)[2]) / kMegaPairs);
  }
}

}  // namespace kvtier
