#include "base/metrics/metric_sum.h"

namespace kvtier {

MetricSum::Series& MetricSum::find(Kind kind, std::string_view name, std::string_view help,
                                   const MetricLabels& labels) {
  std::string key(name);
  for (const auto& [k, v] : labels.pairs) key += '\0' + k + '=' + v;
  auto [it, fresh] = index_.emplace(std::move(key), series_.size());
  if (fresh) series_.push_back(Series{kind, std::string(name), std::string(help), labels, 0, 0, {}});
  return series_[it->second];
}

void MetricSum::counter(std::string_view name, std::string_view help, const MetricLabels& labels,
                        uint64_t value) {
  find(Kind::kCounter, name, help, labels).count += value;
}

void MetricSum::gauge(std::string_view name, std::string_view help, const MetricLabels& labels,
                      double value) {
  find(Kind::kGauge, name, help, labels).level += value;
}

void MetricSum::histogram(std::string_view name, std::string_view help, const MetricLabels& labels,
                          const Histogram::Snapshot& snapshot) {
  Histogram::Snapshot& h = find(Kind::kHistogram, name, help, labels).histogram;
  for (size_t i = 0; i < h.cumulative.size(); ++i) h.cumulative[i] += snapshot.cumulative[i];
  h.count += snapshot.count;
  h.sum += snapshot.sum;
}

void MetricSum::replay(MetricVisitor& out) const {
  for (const Series& s : series_) {
    switch (s.kind) {
      case Kind::kCounter: out.counter(s.name, s.help, s.labels, s.count); break;
      case Kind::kGauge: out.gauge(s.name, s.help, s.labels, s.level); break;
      case Kind::kHistogram: out.histogram(s.name, s.help, s.labels, s.histogram); break;
    }
  }
}

}  // namespace kvtier
