#include "tiers/namespace_usage.h"

#include "base/byte_size.h"

namespace kvtier {

NamespaceUsage::NamespaceUsage(std::string tier, const std::map<std::string, uint64_t, std::less<>>& quotas)
    : tier_(std::move(tier)) {
  for (const auto& [ns, quota] : quotas) shares_[ns].quota = quota;
}

Status NamespaceUsage::charge(std::string_view ns, uint64_t bytes) {
  if (shares_.empty()) return ok_status();
  std::lock_guard lock(mu_);
  auto it = shares_.find(ns);
  if (it == shares_.end()) return ok_status();
  Share& s = it->second;
  const uint64_t held = static_cast<uint64_t>(std::max<int64_t>(0, s.held));
  if (held + bytes > s.quota) {
    ++s.refused;
    return no_space(tier_ + " tier: namespace '" + std::string(ns) + "' holds " + format_byte_size(held) + " of its " +
                    format_byte_size(s.quota) + " quota; a " + format_byte_size(bytes) + " block does not fit");
  }
  s.held += static_cast<int64_t>(bytes);
  return ok_status();
}

void NamespaceUsage::add(std::string_view ns, int64_t bytes) {
  if (shares_.empty() || bytes == 0) return;
  std::lock_guard lock(mu_);
  if (auto it = shares_.find(ns); it != shares_.end()) it->second.held += bytes;
}

uint64_t NamespaceUsage::held(std::string_view ns) const {
  std::lock_guard lock(mu_);
  auto it = shares_.find(ns);
  return it == shares_.end() ? 0 : static_cast<uint64_t>(std::max<int64_t>(0, it->second.held));
}

uint64_t NamespaceUsage::refusals() const {
  std::lock_guard lock(mu_);
  uint64_t n = 0;
  for (const auto& [ns, s] : shares_) n += s.refused;
  return n;
}

void NamespaceUsage::visit_metrics(MetricVisitor& v) const {
  std::lock_guard lock(mu_);
  for (const auto& [ns, s] : shares_) {
    const MetricLabels l{{"tier", tier_}, {"namespace", ns}};
    v.gauge("kvtier_namespace_used_bytes", "Bytes a namespace with a quota holds in the tier", l,
            static_cast<double>(std::max<int64_t>(0, s.held)));
    v.gauge("kvtier_namespace_quota_bytes", "The namespace's quota in the tier", l, static_cast<double>(s.quota));
    v.counter("kvtier_namespace_quota_refusals_total", "Inserts refused because the namespace was at its quota", l,
              s.refused);
  }
}

NamespaceCharge& NamespaceCharge::operator=(NamespaceCharge&& o) noexcept {
  if (this != &o) {
    settle(0);
    usage_ = std::exchange(o.usage_, nullptr);
    ns_ = std::move(o.ns_);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void NamespaceCharge::settle(uint64_t bytes) {
  if (!usage_) return;
  usage_->add(ns_, static_cast<int64_t>(bytes) - static_cast<int64_t>(bytes_));
  usage_ = nullptr;
}

}  // namespace kvtier
