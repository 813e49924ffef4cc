// The two views of every metric the cache, its tiers and the server keep: Prometheus text for
// GET /metrics and JSON for GET /v1/stats. Both are MetricVisitors; walk the modules into one,
// then render. Samples of one metric family are grouped under one HELP/TYPE, as Prometheus needs,
// even when several tiers report them at different points of the walk.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/metrics/metrics.h"

namespace kvtier {

class PrometheusTextWriter final : public MetricVisitor {
 public:
  void counter(std::string_view name, std::string_view help, const MetricLabels& labels,
               uint64_t value) override;
  void gauge(std::string_view name, std::string_view help, const MetricLabels& labels,
             double value) override;
  void histogram(std::string_view name, std::string_view help, const MetricLabels& labels,
                 const Histogram::Snapshot& snapshot) override;
  std::string text() const;

 private:
  struct Family {
    std::string help;
    std::string type;
    std::vector<std::string> samples;
  };
  Family& family(std::string_view name, std::string_view help, const char* type);

  std::vector<std::string> order_;
  std::map<std::string, Family, std::less<>> families_;
};

// {"name": [{"labels": {...}, "value": v}, ...]}; histograms carry count, sum, p50, p99.
class JsonMetricsWriter final : public MetricVisitor {
 public:
  void counter(std::string_view name, std::string_view help, const MetricLabels& labels,
               uint64_t value) override;
  void gauge(std::string_view name, std::string_view help, const MetricLabels& labels,
             double value) override;
  void histogram(std::string_view name, std::string_view help, const MetricLabels& labels,
                 const Histogram::Snapshot& snapshot) override;
  const nlohmann::json& json() const { return json_; }

 private:
  void add(std::string_view name, const MetricLabels& labels, nlohmann::json value);
  nlohmann::json json_ = nlohmann::json::object();
};

}  // namespace kvtier
