// ChainTracker: the shape of the chains a tier holds. A resident block with no resident child is
// a leaf: the end of some cached chain, the only kind whose eviction cannot strand a resident
// child. A resident block whose parent this tier held and gave up is an orphan: no lookup can
// reach it through this tier, so it is worth the least. (A chain's first block has a namespace
// root for parent, which is never held, so it is not an orphan.)
// Not thread-safe (owned by a policy, called under its tier's lock).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "serialize/block_hash.h"

namespace kvtier {

class ChainTracker {
 public:
  // Called with every resident block whose leaf or orphan status changed.
  using Changed = std::function<void(const BlockHash&)>;
  explicit ChainTracker(Changed changed) : changed_(std::move(changed)) {}

  void add(const BlockHash& hash, const BlockHash& parent);
  void remove(const BlockHash& hash);
  bool is_leaf(const BlockHash& hash) const;
  bool is_orphan(const BlockHash& hash) const;

 private:
  struct Node {
    BlockHash parent;
    bool orphan = false;
  };
  void forget_eventually(const BlockHash& hash);

  Changed changed_;
  std::unordered_map<BlockHash, Node> nodes_;  // resident blocks
  // Resident children by parent, whether the parent is resident or not.
  std::unordered_map<BlockHash, std::vector<BlockHash>> children_;
  // Blocks given up lately (as many as are resident, at least 1024): a block inserted under one of
  // them arrives an orphan.
  std::unordered_set<BlockHash> gone_;
  std::deque<BlockHash> gone_order_;
};

}  // namespace kvtier
