#include "tiers/policy/lru_policy.h"

namespace kvtier {

void LruPolicy::inserted(const BlockHash& hash, const BlockHash&, uint64_t) {
  pos_[hash] = order_.insert(order_.end(), hash);
}

void LruPolicy::accessed(const BlockHash& hash) {
  auto it = pos_.find(hash);
  if (it != pos_.end()) order_.splice(order_.end(), order_, it->second);
}

void LruPolicy::pinned(const BlockHash& hash) { removed(hash); }

void LruPolicy::unpinned(const BlockHash& hash) { pos_[hash] = order_.insert(order_.end(), hash); }

void LruPolicy::removed(const BlockHash& hash) {
  auto it = pos_.find(hash);
  if (it == pos_.end()) return;
  order_.erase(it->second);
  pos_.erase(it);
}

std::optional<BlockHash> LruPolicy::victim() {
  if (order_.empty()) return std::nullopt;
  return order_.front();
}

}  // namespace kvtier
