#include "tiers/policy/chain_lru_policy.h"

namespace kvtier {

void ChainLruPolicy::unfile(Entry& e, const BlockHash& hash) {
  if (e.band) e.band->erase({e.tick, hash});
  e.band = nullptr;
}

void ChainLruPolicy::refile(const BlockHash& hash) {
  auto it = entries_.find(hash);
  if (it == entries_.end()) return;  // the tracker reports before the entry exists
  Entry& e = it->second;
  unfile(e, hash);
  if (e.pinned) return;
  e.band = chains_.is_orphan(hash)  ? &orphans_
           : !chains_.is_leaf(hash) ? &inner_
           : e.snapshot             ? &snapshots_
                                    : &leaves_;
  e.band->insert({e.tick, hash});
}

void ChainLruPolicy::inserted(const BlockHash& hash, const BlockHash& parent, uint64_t) {
  entries_[hash] = Entry{++clock_, false, false, nullptr};
  chains_.add(hash, parent);
  refile(hash);
}

void ChainLruPolicy::inserted_snapshot(const BlockHash& hash, const BlockHash& parent, uint64_t) {
  entries_[hash] = Entry{++clock_, false, true, nullptr};
  chains_.add(hash, parent);
  refile(hash);
}

void ChainLruPolicy::accessed(const BlockHash& hash) {
  auto it = entries_.find(hash);
  if (it == entries_.end()) return;
  unfile(it->second, hash);
  it->second.tick = ++clock_;
  refile(hash);
}

void ChainLruPolicy::pinned(const BlockHash& hash) {
  auto it = entries_.find(hash);
  if (it == entries_.end()) return;
  unfile(it->second, hash);
  it->second.pinned = true;
}

void ChainLruPolicy::unpinned(const BlockHash& hash) {
  auto it = entries_.find(hash);
  if (it == entries_.end()) return;
  it->second.pinned = false;
  it->second.tick = ++clock_;  // just used
  refile(hash);
}

void ChainLruPolicy::removed(const BlockHash& hash) {
  auto it = entries_.find(hash);
  if (it == entries_.end()) return;
  unfile(it->second, hash);
  entries_.erase(it);
  chains_.remove(hash);  // refiles its parent and children
}

std::optional<BlockHash> ChainLruPolicy::victim() {
  for (const std::set<Key>* band : {&orphans_, &leaves_, &snapshots_, &inner_}) {
    if (!band->empty()) return band->begin()->second;
  }
  return std::nullopt;
}

std::optional<BlockHash> ChainLruPolicy::orphan() {
  if (orphans_.empty()) return std::nullopt;
  return orphans_.begin()->second;
}

}  // namespace kvtier
