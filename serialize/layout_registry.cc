#include "serialize/layout_registry.h"

namespace kvtier {

Result<std::shared_ptr<const KvLayout>> LayoutRegistry::add(const KvLayout& layout) {
  KVTIER_RETURN_IF_ERROR(layout.validate());
  const uint64_t fp = layout.fingerprint();
  std::lock_guard lock(mu_);
  auto it = by_fingerprint_.find(fp);
  if (it != by_fingerprint_.end()) return it->second;
  auto shared = std::make_shared<const KvLayout>(layout);
  by_fingerprint_.emplace(fp, shared);
  return shared;
}

std::shared_ptr<const KvLayout> LayoutRegistry::find(uint64_t fingerprint) const {
  std::lock_guard lock(mu_);
  auto it = by_fingerprint_.find(fingerprint);
  return it == by_fingerprint_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<const KvLayout>> LayoutRegistry::all() const {
  std::lock_guard lock(mu_);
  std::vector<std::shared_ptr<const KvLayout>> out;
  for (const auto& [fp, l] : by_fingerprint_) out.push_back(l);
  return out;
}

}  // namespace kvtier
