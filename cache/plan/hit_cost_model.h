// HitCostModel: what a cache hit costs here, learned from real requests — each tier's restore (a
// fixed cost per fetch plus seconds per byte, uploads to the top tier included) and the engine's
// prefill (seconds as a function of the chunk's tokens and the context before it). A hit has to
// beat recomputing, and which wins depends on the machine: on an H100 a tiny model's prefill is
// faster than its own SSD restore, on lavapipe the reverse. The planner (hit_planner.h) asks this
// model; kvtierd's /v1/lookup hands its restore estimates to engines that plan for themselves.
//
// Estimates are exponentially weighted least-squares fits (recent requests count most: a disk
// that got busier is seen within a few fetches). A tier's first restore only warms up; from its
// second on, restores of one size give a rate through the origin, and two sizes a fixed cost and
// a rate. The prefill needs three samples that determine its fit. Until then an estimate is
// unknown (nullopt) and a planner falls back to loading.
// A sample more than kOutlierFactor times the current estimate is held back, and taken only if
// the next one is high too (the machine got slower); alone it is dropped and counted. One-offs —
// a pipeline compiled for a new shape, a scratch buffer grown, a disk's hiccup — would otherwise
// rule a least-squares fit for dozens of requests. H100, tiny model, 8192 tokens: plans predicted
// a 26 ms prefill for one that took 8.6, after the run's first forward of that length (untimed
// calibration had stopped at half of it). Fed a sequence like that run's (one 150 ms forward
// among 8.6 ms ones), this fit predicts 22-27 ms without the guard and 8.5 with it.
// An estimate is refreshed only by restores, and a planner that believes a tier slow stops
// loading from it: one slow moment would then cost that tier its hits for the process's life.
// So a planner counts the plans that computed a tier's blocks (note_unloaded) and, after enough
// of them, loads once to time it (a probe, note_probe). A restore far below its estimate asks for
// the next plan to probe again, and two in a row replace the tier's fit: the machine got faster.
// A probe that finds the estimate right doubles the wait for the next one (up to 32 times): on
// the H100 a probe where computing wins cost its request 1.7-2.2x the plan's time. The overlap
// factor has the same trap (splits that ran slow stop being chosen, so none is timed again) and
// the same remedy: a split that would win at factor 1 but is passed over is tried now and then
// (note_unsplit, note_split_probe).
// Thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "base/log.h"
#include "base/metrics/metrics.h"
#include "cache/cache_metrics.h"

namespace kvtier {

// y ~ c . x over recent samples, each weight multiplied by `decay` per new sample.
template <size_t N>
class DecayingLeastSquares {
 public:
  explicit DecayingLeastSquares(double decay) : decay_(decay) {}
  void add(const std::array<double, N>& x, double y);
  // The coefficients, or nullopt while the samples do not determine them.
  std::optional<std::array<double, N>> fit() const;
  // Only the last input's coefficient, the others zero: for samples that never varied the rest.
  std::optional<std::array<double, N>> fit_through_origin() const;
  // Every sample's y times r, so the fit's coefficients are r times theirs: the same shape at
  // another speed.
  void scale(double r) {
    for (double& v : xy_) v *= r;
  }
  uint64_t samples() const { return samples_; }

 private:
  double decay_;
  std::array<std::array<double, N>, N> xx_{};
  std::array<double, N> xy_{};
  uint64_t samples_ = 0;
};

class HitCostModel {
 public:
  HitCostModel();

  // A fetch moved `bytes` from `tier` into the top tier in `seconds`. Each tier's first one only
  // warms up: it pays one-off costs (the GPU importing RAM chunks, first-touch page faults) that
  // made it several times its successors on the H100, and a least-squares fit of three samples
  // kept a third of that error (a 2048-token RAM hit was then planned as a recompute).
  void observe_restore(size_t tier, uint64_t bytes, double seconds);
  // A prefill computed `tokens` rows after `context` cached ones in `seconds`. Two in a row under
  // a third of their estimates scale the whole fit down to them: the GPU is faster than the fit
  // learnt (one calibrated while a freshly started GPU ran 3-10x slow, whose fit then put a
  // 2048-token prefill at 1.2 s against 1.5 ms measured, and planned every hit as a load).
  void observe_prefill(uint64_t tokens, uint64_t context, double seconds);

  std::optional<double> restore_seconds(size_t tier, uint64_t bytes) const;
  std::optional<double> prefill_seconds(uint64_t tokens, uint64_t context) const;

  // A split plan's front computed while its back loaded took `seconds`; its parts alone were
  // predicted to take `predicted` (the longer of the two). They share the machine — the loader's
  // copies and uploads against the prefill's launches — so together they run slower than either
  // alone: the tiny model's SSD splits on the H100 (8192 and 32768 tokens) took 1.3-1.8x their
  // prediction, and at 8192 lost to recomputing. The ratio, averaged over recent splits, scales
  // the next plans' overlap.
  void observe_overlap(double predicted, double seconds);
  double overlap_factor() const;

  // A plan computed blocks of `tier` it could have loaded (its estimate said computing wins).
  void note_unloaded(size_t tier);
  // A plan loads `tier`'s blocks to time them although its estimate says computing wins.
  void note_probe(size_t tier);
  // Probes so far, per tier.
  uint64_t probes(size_t tier) const;
  // A plan passed over a split that would win were the overlap factor 1.
  void note_unsplit();
  // A plan tries such a split to time the overlap again.
  void note_split_probe();
  uint64_t split_probes() const;

  // The fitted coefficients at one moment, to evaluate many times without locking (a planner
  // tries every split of a prefix of thousands of blocks).
  struct Snapshot {
    std::array<std::optional<std::array<double, 2>>, kMaxTiers> restore;  // seconds ~ a + b * MiB
    std::optional<std::array<double, 3>> prefill;
    double overlap = 1.0;  // overlap_factor()
    // Per tier: plans that computed its blocks since its last restore or probe; whether its last
    // restore came in far below the estimate (the next plan should probe it again); and how many
    // times the planner's interval the next probe waits (probes that found the estimate right
    // double it, up to kMaxProbeBackoff: where computing keeps winning, probes grow rare).
    std::array<uint64_t, kMaxTiers> unloaded{};
    std::array<bool, kMaxTiers> probe_now{};
    std::array<uint64_t, kMaxTiers> probe_backoff{};
    // The same for splits: plans that passed one over since the last split, whether the last
    // split probe ran well under the factor (the next plan should try again), and the wait's
    // multiple.
    uint64_t unsplit = 0;
    bool split_probe_now = false;
    uint64_t split_backoff = 1;
    std::optional<double> restore_seconds(size_t tier, uint64_t bytes) const;
    std::optional<double> prefill_seconds(uint64_t tokens, uint64_t context) const;
  };
  Snapshot snapshot() const;

  // For tests and benchmarks: estimates measured elsewhere, as if observed.
  void set_restore(size_t tier, double fixed_seconds, double bytes_per_second);
  void set_prefill(double fixed_seconds, double seconds_per_token, double seconds_per_token_pair);

  // kvtier_hit_cost_* gauges: each tier's fitted rate and fixed cost, the prefill's coefficients;
  // kvtier_hit_cost_outliers_dropped_total per kind (prefill, restore);
  // kvtier_hit_cost_probes_total per tier; kvtier_hit_cost_split_probes_total.
  void visit_metrics(MetricVisitor& visitor, const std::vector<std::string>& tier_names) const;

  static constexpr double kOutlierFactor = 3.0;
  static constexpr uint64_t kMaxProbeBackoff = 32;
  // Samples dropped as one-off outliers so far: prefill, restore (any tier).
  std::pair<uint64_t, uint64_t> outliers_dropped() const;

 private:
  // A sample waiting for the next one of its fit to say whether it was a one-off.
  template <size_t N>
  struct Held {
    bool any = false;
    std::array<double, N> x{};
    double y = 0, estimate = 0;
  };
  // Adds (x, y) to `fit` unless it is an outlier against `estimate` (see the header's note).
  template <size_t N>
  void add_guarded(DecayingLeastSquares<N>& fit, Held<N>& held, std::optional<double> estimate,
                   const std::array<double, N>& x, double y, uint64_t& dropped, const char* what);

  mutable std::mutex mu_;                                   // guards the fits
  std::array<DecayingLeastSquares<2>, kMaxTiers> restore_;  // seconds ~ a + b * bytes
  std::array<bool, kMaxTiers> restore_warm_{};              // the tier's first restore was seen
  std::array<Held<2>, kMaxTiers> restore_held_{};
  // A restore far below its estimate, kept to start a new fit if the next one is far below too.
  std::array<Held<2>, kMaxTiers> restore_low_{};
  std::array<uint64_t, kMaxTiers> unloaded_{};
  std::array<bool, kMaxTiers> probe_now_{};
  std::array<uint64_t, kMaxTiers> probes_{};
  std::array<uint64_t, kMaxTiers> probe_backoff_{};  // 1 each (the constructor)
  std::array<bool, kMaxTiers> probing_{};            // a probe's restore has not come in yet
  uint64_t unsplit_ = 0, split_backoff_ = 1, split_probes_ = 0;
  bool split_probe_now_ = false, split_probing_ = false;
  LogThrottle probe_log_;
  // seconds ~ a + b * tokens + c * tokens * (context + tokens / 2): the attention's pairs
  DecayingLeastSquares<3> prefill_;
  Held<3> prefill_held_;
  Held<3>
      prefill_low_;  // a prefill far below its estimate: the next one says if the GPU got faster
  double overlap_ = 1.0;  // a moving average of split overlaps' time over their prediction
  uint64_t prefill_dropped_ = 0, restore_dropped_ = 0;
  LogThrottle outlier_log_;
};

}  // namespace kvtier
