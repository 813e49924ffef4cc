// S3FifoPolicy: S3-FIFO (Yang et al., SOSP 2023) over blocks. New blocks enter a small FIFO (a
// tenth of the tier's bytes); one read there earns a move to the main FIFO, none means eviction
// and a place in a ghost queue, and a block the ghost remembers goes straight to main when it
// comes back. Main is a FIFO with up to three reinsertions for blocks read since their last
// pass. A one-off scan never gets past the small queue, so it cannot flush shared prompts.
// With `chain_aware`, orphans (blocks whose parent the tier gave up, which no lookup reaches
// through it) go before anything else, and main gives up leaves before the blocks they extend:
// a scan whose head was evicted leaves at once, and a chain never outlives its root here.
#pragma once

#include <deque>
#include <list>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "tiers/policy/chain_tracker.h"
#include "tiers/policy/eviction_policy.h"

namespace kvtier {

class S3FifoPolicy final : public EvictionPolicy {
 public:
  explicit S3FifoPolicy(bool chain_aware)
      : chain_aware_(chain_aware), chains_([this](const BlockHash& h) { refile_orphan(h); }) {}
  std::string_view name() const override { return chain_aware_ ? "s3fifo-chain" : "s3fifo"; }
  void inserted(const BlockHash& hash, const BlockHash& parent, uint64_t bytes) override;
  void accessed(const BlockHash& hash) override;
  void pinned(const BlockHash& hash) override;
  void unpinned(const BlockHash& hash) override;
  void removed(const BlockHash& hash) override;
  std::optional<BlockHash> victim() override;
  std::optional<BlockHash> orphan() override;

 private:
  enum class Queue { kSmall, kMain };
  struct Entry {
    Queue queue = Queue::kSmall;
    int freq = 0;  // reads since the last pass, capped at 3
    bool pinned = false;
    bool in_orphans = false;
    uint64_t tick = 0;  // insertion order, for the orphan set
    uint64_t bytes = 0;
    std::list<BlockHash>::iterator pos;  // valid while unpinned
  };
  std::list<BlockHash>& queue(Queue q) { return q == Queue::kSmall ? small_ : main_; }
  void enqueue(const BlockHash& hash, Entry& e, Queue q);
  void dequeue(Entry& e);
  void remember_ghost(const BlockHash& hash);
  void refile_orphan(const BlockHash& hash);

  const bool chain_aware_;
  ChainTracker chains_;
  std::unordered_map<BlockHash, Entry> entries_;
  std::list<BlockHash> small_, main_;  // unpinned, oldest first
  uint64_t small_bytes_ = 0, total_bytes_ = 0;
  std::deque<BlockHash> ghost_order_;
  std::unordered_set<BlockHash> ghost_;
  std::optional<BlockHash> evicting_from_small_;  // the last victim, if small: remembered on removal
  std::set<std::pair<uint64_t, BlockHash>> orphans_;  // unpinned orphans, oldest first (chain_aware)
  uint64_t clock_ = 0;
};

}  // namespace kvtier
