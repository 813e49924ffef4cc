// NamespaceTraffic: the record bytes the SSD tier wrote and read back for each namespace, so an
// operator can see which tenant (model) the drive's writes go to and how many bytes each writes
// per byte it reads back: its write amplification. The tier-wide estimate of bytes written for
// nothing (WriteOutcomeSample) says how much; this says whose. Bounded: the first kMaxNamespaces
// namespaces get their own series, later ones share namespace="other".
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

#include "base/metrics/metrics.h"

namespace kvtier {

// Thread-safe.
class NamespaceTraffic {
 public:
  static constexpr size_t kMaxNamespaces = 64;
  static constexpr std::string_view kOther = "other";

  // Record bytes written: spilled, or moved by reclaim (both wear the drive).
  void wrote(std::string_view ns, uint64_t bytes);
  // Record bytes (padded, as the disk read them) read back to serve a hit.
  void read(std::string_view ns, uint64_t bytes);
  uint64_t written_bytes(std::string_view ns) const;
  uint64_t read_bytes(std::string_view ns) const;

  // kvtier_ssd_namespace_written_bytes_total and kvtier_ssd_namespace_read_bytes_total.
  void visit_metrics(MetricVisitor& v) const;

 private:
  struct Bytes {
    uint64_t written = 0;
    uint64_t read = 0;
  };
  Bytes& slot(std::string_view ns);  // under mu_

  mutable std::mutex mu_;
  std::map<std::string, Bytes, std::less<>> by_ns_;
};

}  // namespace kvtier
