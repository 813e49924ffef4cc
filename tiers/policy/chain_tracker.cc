#include "tiers/policy/chain_tracker.h"

#include <algorithm>

namespace kvtier {

void ChainTracker::add(const BlockHash& hash, const BlockHash& parent) {
  const bool parent_resident = nodes_.count(parent) > 0;
  const bool parent_was_leaf = parent_resident && is_leaf(parent);
  nodes_[hash] = Node{parent, !parent_resident && gone_.count(parent) > 0};
  children_[parent].push_back(hash);
  gone_.erase(hash);
  if (parent_was_leaf) changed_(parent);
  // Children it left behind when it was given up are no longer orphans.
  auto kids = children_.find(hash);
  if (kids == children_.end()) return;
  for (const BlockHash& c : kids->second) {
    auto n = nodes_.find(c);
    if (n != nodes_.end() && n->second.orphan) {
      n->second.orphan = false;
      changed_(c);
    }
  }
}

void ChainTracker::remove(const BlockHash& hash) {
  auto it = nodes_.find(hash);
  if (it == nodes_.end()) return;
  const BlockHash parent = it->second.parent;
  nodes_.erase(it);
  auto siblings = children_.find(parent);
  if (siblings != children_.end()) {
    std::erase(siblings->second, hash);
    if (siblings->second.empty()) children_.erase(siblings);
  }
  forget_eventually(hash);
  if (nodes_.count(parent) && is_leaf(parent)) changed_(parent);
  auto kids = children_.find(hash);
  if (kids == children_.end()) return;
  for (const BlockHash& c : kids->second) {
    auto n = nodes_.find(c);
    if (n != nodes_.end() && !n->second.orphan) {
      n->second.orphan = true;
      changed_(c);
    }
  }
}

void ChainTracker::forget_eventually(const BlockHash& hash) {
  if (!gone_.insert(hash).second) return;
  gone_order_.push_back(hash);
  while (gone_order_.size() > std::max<size_t>(1024, nodes_.size())) {
    gone_.erase(gone_order_.front());
    gone_order_.pop_front();
  }
}

bool ChainTracker::is_leaf(const BlockHash& hash) const {
  auto kids = children_.find(hash);
  return kids == children_.end() || kids->second.empty();
}

bool ChainTracker::is_orphan(const BlockHash& hash) const {
  auto it = nodes_.find(hash);
  return it != nodes_.end() && it->second.orphan;
}

}  // namespace kvtier
