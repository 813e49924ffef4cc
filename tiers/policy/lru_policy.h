// LruPolicy: least recently inserted or read first. The baseline every other policy is measured
// against (bench/hit_ratio_bench).
#pragma once

#include <list>
#include <unordered_map>

#include "tiers/policy/eviction_policy.h"

namespace kvtier {

class LruPolicy final : public EvictionPolicy {
 public:
  std::string_view name() const override { return "lru"; }
  void inserted(const BlockHash& hash, const BlockHash& parent, uint64_t bytes) override;
  void accessed(const BlockHash& hash) override;
  void pinned(const BlockHash& hash) override;
  void unpinned(const BlockHash& hash) override;
  void removed(const BlockHash& hash) override;
  std::optional<BlockHash> victim() override;

 private:
  std::list<BlockHash> order_;  // unpinned, least recent first
  std::unordered_map<BlockHash, std::list<BlockHash>::iterator> pos_;  // unpinned only
};

}  // namespace kvtier
