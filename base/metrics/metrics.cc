#include "base/metrics/metrics.h"

#include <algorithm>
#include <cmath>

namespace kvtier {

const std::array<double, Histogram::kBuckets>& Histogram::upper_bounds() {
  static const std::array<double, kBuckets> bounds = [] {
    std::array<double, kBuckets> b{};
    double v = 50e-6;
    for (size_t i = 0; i < kBuckets; ++i) {
      b[i] = v;
      v *= 2;
    }
    return b;
  }();
  return bounds;
}

void Histogram::observe(double seconds) {
  const auto& bounds = upper_bounds();
  size_t i = std::lower_bound(bounds.begin(), bounds.end(), seconds) - bounds.begin();
  if (i < kBuckets) buckets_[i].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(static_cast<uint64_t>(std::max(0.0, seconds) * 1e9),
                    std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s;
  uint64_t running = 0;
  for (size_t i = 0; i < kBuckets; ++i) {
    running += buckets_[i].load(std::memory_order_relaxed);
    s.cumulative[i] = running;
  }
  s.count = count_.load(std::memory_order_relaxed);
  s.sum = static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) * 1e-9;
  return s;
}

double Histogram::Snapshot::quantile(double q) const {
  if (count == 0) return 0;
  const auto& bounds = upper_bounds();
  double rank = q * static_cast<double>(count);
  uint64_t prev = 0;
  for (size_t i = 0; i < kBuckets; ++i) {
    if (static_cast<double>(cumulative[i]) >= rank) {
      double lo = i == 0 ? 0.0 : bounds[i - 1];
      uint64_t in_bucket = cumulative[i] - prev;
      double frac = in_bucket ? (rank - static_cast<double>(prev)) / in_bucket : 1.0;
      return lo + (bounds[i] - lo) * std::clamp(frac, 0.0, 1.0);
    }
    prev = cumulative[i];
  }
  return bounds.back();
}

}  // namespace kvtier
