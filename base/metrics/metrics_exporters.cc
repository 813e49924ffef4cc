#include "base/metrics/metrics_exporters.h"

#include <cmath>
#include <cstdio>

namespace kvtier {
namespace {

std::string escape_label(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

std::string render_labels(const MetricLabels& labels, const std::string& extra = "") {
  std::string out;
  for (const auto& [k, v] : labels.pairs) {
    out += (out.empty() ? "" : ",") + k + "=\"" + escape_label(v) + "\"";
  }
  if (!extra.empty()) out += (out.empty() ? "" : ",") + extra;
  return out.empty() ? "" : "{" + out + "}";
}

std::string number(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

}  // namespace

PrometheusTextWriter::Family& PrometheusTextWriter::family(std::string_view name, std::string_view help,
                                                           const char* type) {
  auto it = families_.find(name);
  if (it == families_.end()) {
    order_.emplace_back(name);
    it = families_.emplace(std::string(name), Family{std::string(help), type, {}}).first;
  }
  return it->second;
}

void PrometheusTextWriter::counter(std::string_view name, std::string_view help,
                                   const MetricLabels& labels, uint64_t value) {
  family(name, help, "counter").samples.push_back(std::string(name) + render_labels(labels) + " " +
                                                  std::to_string(value));
}

void PrometheusTextWriter::gauge(std::string_view name, std::string_view help, const MetricLabels& labels,
                                 double value) {
  family(name, help, "gauge").samples.push_back(std::string(name) + render_labels(labels) + " " + number(value));
}

void PrometheusTextWriter::histogram(std::string_view name, std::string_view help,
                                     const MetricLabels& labels, const Histogram::Snapshot& s) {
  Family& f = family(name, help, "histogram");
  const std::string n(name);
  const auto& bounds = Histogram::upper_bounds();
  for (size_t i = 0; i < bounds.size(); ++i) {
    f.samples.push_back(n + "_bucket" + render_labels(labels, "le=\"" + number(bounds[i]) + "\"") + " " +
                        std::to_string(s.cumulative[i]));
  }
  f.samples.push_back(n + "_bucket" + render_labels(labels, "le=\"+Inf\"") + " " + std::to_string(s.count));
  f.samples.push_back(n + "_sum" + render_labels(labels) + " " + number(s.sum));
  f.samples.push_back(n + "_count" + render_labels(labels) + " " + std::to_string(s.count));
}

std::string PrometheusTextWriter::text() const {
  std::string out;
  for (const std::string& name : order_) {
    const Family& f = families_.find(name)->second;
    out += "# HELP " + name + " " + f.help + "\n# TYPE " + name + " " + f.type + "\n";
    for (const std::string& s : f.samples) out += s + "\n";
  }
  return out;
}

void JsonMetricsWriter::add(std::string_view name, const MetricLabels& labels, nlohmann::json value) {
  nlohmann::json l = nlohmann::json::object();
  for (const auto& [k, v] : labels.pairs) l[k] = v;
  json_[std::string(name)].push_back({{"labels", l}, {"value", std::move(value)}});
}

void JsonMetricsWriter::counter(std::string_view name, std::string_view, const MetricLabels& labels,
                                uint64_t value) {
  add(name, labels, value);
}

void JsonMetricsWriter::gauge(std::string_view name, std::string_view, const MetricLabels& labels,
                              double value) {
  add(name, labels, value);
}

void JsonMetricsWriter::histogram(std::string_view name, std::string_view, const MetricLabels& labels,
                                  const Histogram::Snapshot& s) {
  add(name, labels,
      {{"count", s.count}, {"sum", s.sum}, {"p50", s.quantile(0.5)}, {"p99", s.quantile(0.99)}});
}

}  // namespace kvtier
