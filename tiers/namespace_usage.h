// NamespaceUsage: the bytes each namespace with a quota holds in one tier, and the refusals of
// inserts that would take it past its quota. Tenants share a cache; a quota keeps one tenant's
// prompts from pushing out everyone else's. Namespaces without a quota are not tracked.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

#include "base/metrics/metrics.h"
#include "base/status.h"

namespace kvtier {

// Thread-safe.
class NamespaceUsage {
 public:
  NamespaceUsage(std::string tier, const std::map<std::string, uint64_t, std::less<>>& quotas);

  bool empty() const { return shares_.empty(); }
  bool tracked(std::string_view ns) const { return shares_.count(ns) > 0; }
  // Adds `bytes` to the namespace unless that would pass its quota: then kNoSpace (counted),
  // naming the namespace, what it holds and its quota. OK for a namespace without a quota.
  Status charge(std::string_view ns, uint64_t bytes);
  // Adds (or, negative, removes) bytes the namespace holds; nothing for one without a quota.
  void add(std::string_view ns, int64_t bytes);
  uint64_t held(std::string_view ns) const;
  uint64_t refusals() const;

  // kvtier_namespace_{used,quota}_bytes and kvtier_namespace_quota_refusals_total.
  void visit_metrics(MetricVisitor& v) const;

 private:
  struct Share {
    uint64_t quota = 0;
    int64_t held = 0;
    uint64_t refused = 0;
  };
  const std::string tier_;
  mutable std::mutex mu_;
  std::map<std::string, Share, std::less<>> shares_;  // keys fixed at construction
};

// Bytes charged to a namespace for a block on its way into a tier: given back when dropped,
// unless settle() says what the block holds now that it is in.
class NamespaceCharge {
 public:
  NamespaceCharge() = default;
  NamespaceCharge(NamespaceUsage* usage, std::string ns, uint64_t bytes)
      : usage_(usage), ns_(std::move(ns)), bytes_(bytes) {}
  NamespaceCharge(NamespaceCharge&& o) noexcept { *this = std::move(o); }
  NamespaceCharge& operator=(NamespaceCharge&& o) noexcept;
  ~NamespaceCharge() { settle(0); }

  // The block is stored and holds `bytes` (the charge was an estimate); nothing is given back.
  void settle(uint64_t bytes);

 private:
  NamespaceUsage* usage_ = nullptr;
  std::string ns_;
  uint64_t bytes_ = 0;
};

}  // namespace kvtier
