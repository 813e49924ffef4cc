// Metric primitives (counters, gauges, histograms) and the visitor through which they are
// exported. Each module owns a metrics struct beside the code that causes the counts; the server
// only walks them (base/metrics/metrics_exporters.h renders them) — there is no global registry.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvtier {

// Monotonic count. Thread-safe, lock-free.
class Counter {
 public:
  void inc(uint64_t n = 1) { v_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> v_{0};
};

// A level that goes up and down (bytes held, queue depth). Thread-safe, lock-free.
class Gauge {
 public:
  void set(int64_t v) { v_.store(v, std::memory_order_relaxed); }
  void add(int64_t d) { v_.fetch_add(d, std::memory_order_relaxed); }
  int64_t value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> v_{0};
};

// Latency histogram in seconds with fixed exponential buckets (50 us .. ~100 s). Thread-safe.
class Histogram {
 public:
  static constexpr size_t kBuckets = 22;
  static const std::array<double, kBuckets>& upper_bounds();

  void observe(double seconds);
  struct Snapshot {
    std::array<uint64_t, kBuckets> cumulative{};  // count of observations <= each bound
    uint64_t count = 0;
    double sum = 0;
    // Linear interpolation inside the bucket holding quantile q (0..1).
    double quantile(double q) const;
  };
  Snapshot snapshot() const;

 private:
  std::array<std::atomic<uint64_t>, kBuckets> buckets_{};
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> sum_ns_{0};
};

// One label pair rendered as Prometheus text: {reason="queue_full"}.
struct MetricLabels {
  std::vector<std::pair<std::string, std::string>> pairs;
  MetricLabels() = default;
  MetricLabels(std::initializer_list<std::pair<std::string, std::string>> p) : pairs(p) {}
};

// Receives every metric of a module; implemented by exporters (Prometheus text, JSON stats).
class MetricVisitor {
 public:
  virtual ~MetricVisitor() = default;
  virtual void counter(std::string_view name, std::string_view help, const MetricLabels& labels,
                       uint64_t value) = 0;
  virtual void gauge(std::string_view name, std::string_view help, const MetricLabels& labels,
                     double value) = 0;
  virtual void histogram(std::string_view name, std::string_view help,
                         const MetricLabels& labels, const Histogram::Snapshot& snapshot) = 0;
};

}  // namespace kvtier
