// MetricSum: adds up the metrics of several instances of one module (the SSD tier of each
// directory of a striped cache) so they are exported as one set of series, the same names and
// labels one instance would give, instead of a duplicate series per instance.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "base/metrics/metrics.h"

namespace kvtier {

// Visit every instance into it, then replay() the sums, in the order first seen.
class MetricSum final : public MetricVisitor {
 public:
  void counter(std::string_view name, std::string_view help, const MetricLabels& labels,
               uint64_t value) override;
  void gauge(std::string_view name, std::string_view help, const MetricLabels& labels,
             double value) override;
  void histogram(std::string_view name, std::string_view help, const MetricLabels& labels,
                 const Histogram::Snapshot& snapshot) override;
  void replay(MetricVisitor& out) const;

 private:
  enum class Kind { kCounter, kGauge, kHistogram };
  struct Series {
    Kind kind;
    std::string name, help;
    MetricLabels labels;
    uint64_t count = 0;
    double level = 0;
    Histogram::Snapshot histogram;
  };
  Series& find(Kind kind, std::string_view name, std::string_view help, const MetricLabels& labels);

  std::vector<Series> series_;
  std::map<std::string, size_t> index_;  // name + labels -> series_
};

}  // namespace kvtier
