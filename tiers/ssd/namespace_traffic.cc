#include "tiers/ssd/namespace_traffic.h"

namespace kvtier {

NamespaceTraffic::Bytes& NamespaceTraffic::slot(std::string_view ns) {
  if (auto it = by_ns_.find(ns); it != by_ns_.end()) return it->second;
  // kOther itself is a key too: it counts one series past the limit.
  if (by_ns_.size() >= kMaxNamespaces) return by_ns_[std::string(kOther)];
  return by_ns_[std::string(ns)];
}

void NamespaceTraffic::wrote(std::string_view ns, uint64_t bytes) {
  std::lock_guard lock(mu_);
  slot(ns).written += bytes;
}

void NamespaceTraffic::read(std::string_view ns, uint64_t bytes) {
  std::lock_guard lock(mu_);
  slot(ns).read += bytes;
}

uint64_t NamespaceTraffic::written_bytes(std::string_view ns) const {
  std::lock_guard lock(mu_);
  auto it = by_ns_.find(ns);
  return it == by_ns_.end() ? 0 : it->second.written;
}

uint64_t NamespaceTraffic::read_bytes(std::string_view ns) const {
  std::lock_guard lock(mu_);
  auto it = by_ns_.find(ns);
  return it == by_ns_.end() ? 0 : it->second.read;
}

void NamespaceTraffic::visit_metrics(MetricVisitor& v) const {
  std::lock_guard lock(mu_);
  for (const auto& [ns, b] : by_ns_) {
    v.counter("kvtier_ssd_namespace_written_bytes_total",
              "Record bytes the SSD tier wrote for a namespace (spills and reclaim moves)",
              {{"namespace", ns}}, b.written);
    v.counter("kvtier_ssd_namespace_read_bytes_total",
              "Record bytes the SSD tier read back for a namespace's hits", {{"namespace", ns}},
              b.read);
  }
}

}  // namespace kvtier
