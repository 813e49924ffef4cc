// ChainLruPolicy: least recently used first, in three bands. First orphans (blocks whose parent
// this tier gave up: no lookup reaches them through it), then leaves (blocks no resident block
// extends), then inner blocks. A prefix fetch reads a chain root first, so plain LRU finds a
// chain's root older than its tail and evicts it first, stranding the tail; and a prompt longer
// than the tier makes LRU evict its own beginning while it is inserted. Evicting leaves first
// keeps resident chains whole, and orphans first keeps a long prompt's head while its tail
// passes through. A hybrid model's state snapshot that is a leaf goes after the other leaves and
// before inner blocks: a chain's blocks past its last snapshot first, then the snapshot, then
// (now leaves) the blocks it restores.
#pragma once

#include <set>
#include <unordered_map>

#include "tiers/policy/chain_tracker.h"
#include "tiers/policy/eviction_policy.h"

namespace kvtier {

class ChainLruPolicy final : public EvictionPolicy {
 public:
  ChainLruPolicy() : chains_([this](const BlockHash& h) { refile(h); }) {}
  std::string_view name() const override { return "chain-lru"; }
  void inserted(const BlockHash& hash, const BlockHash& parent, uint64_t bytes) override;
  void inserted_snapshot(const BlockHash& hash, const BlockHash& parent, uint64_t bytes) override;
  void accessed(const BlockHash& hash) override;
  void pinned(const BlockHash& hash) override;
  void unpinned(const BlockHash& hash) override;
  void removed(const BlockHash& hash) override;
  std::optional<BlockHash> victim() override;
  std::optional<BlockHash> orphan() override;

 private:
  using Key = std::pair<uint64_t, BlockHash>;  // (last use, hash)
  struct Entry {
    uint64_t tick = 0;
    bool pinned = false;
    bool snapshot = false;
    std::set<Key>* band = nullptr;  // where it is filed; null while pinned or being added
  };
  // Files `hash` in the band its shape says (unless pinned).
  void refile(const BlockHash& hash);
  void unfile(Entry& e, const BlockHash& hash);

  ChainTracker chains_;
  std::unordered_map<BlockHash, Entry> entries_;
  std::set<Key> orphans_, leaves_, snapshots_, inner_;  // unpinned, oldest first
  uint64_t clock_ = 0;
};

}  // namespace kvtier
