// EvictionPolicy: the order in which a byte-bounded tier gives its blocks up. The tier tells the
// policy what happens to its blocks (inserted, accessed, pinned, unpinned, removed) and asks it
// for the next victim; the policy never sees block bytes. A prefix cache has a shape LRU ignores:
// a block is useless once its parent is gone (lookups stop at the first missing block), and one
// long one-off prompt touches many blocks once. The policies here differ in how they use that.
// Not thread-safe: the tier calls its policy under its own lock.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "serialize/block_hash.h"

namespace kvtier {

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  virtual std::string_view name() const = 0;
  // The tier's capacity, told once before anything enters. Only a policy that simulates the
  // tier (adaptive) needs it.
  virtual void set_capacity(uint64_t /*bytes*/) {}

  // A block entered the tier, unpinned. `parent` is its chain parent (a namespace root for a
  // prompt's first block, which is never resident).
  virtual void inserted(const BlockHash& hash, const BlockHash& parent, uint64_t bytes) = 0;
  // A hybrid model's state snapshot (serialize/state_record.h), a child of the block it ends at.
  // Chain-aware policies keep it until the blocks of its chain past it are gone: those cannot be
  // resumed without a later snapshot, and it is what makes its prefix restorable.
  virtual void inserted_snapshot(const BlockHash& hash, const BlockHash& parent, uint64_t bytes) {
    inserted(hash, parent, bytes);
  }
  // The block was read (a hit).
  virtual void accessed(const BlockHash& hash) = 0;
  // While pinned a block is never a victim; pins do not nest here (the tier counts them).
  virtual void pinned(const BlockHash& hash) = 0;
  virtual void unpinned(const BlockHash& hash) = 0;
  // The block left the tier (a victim the tier evicted, or an erase).
  virtual void removed(const BlockHash& hash) = 0;
  // The policy evicting now: this one, or for one that follows others (adaptive), the one it
  // follows; and how often that changed.
  virtual std::string_view active() const { return name(); }
  virtual uint64_t active_changes() const { return 0; }
  // The block to evict next, or nullopt when every block is pinned. The tier then removes it.
  virtual std::optional<BlockHash> victim() = 0;
  // For a chain-aware policy: an unpinned orphan (a block whose parent the tier gave up), which
  // the tier hands down at once instead of keeping a block no lookup reaches through it.
  virtual std::optional<BlockHash> orphan() { return std::nullopt; }
};

// "lru", "chain-lru", "s3fifo", "s3fifo-chain", "adaptive" or "auto" (see eviction_policy_names()).
Result<std::unique_ptr<EvictionPolicy>> make_eviction_policy(std::string_view name);
std::vector<std::string_view> eviction_policy_names();
// What "auto" (the default) means for a RAM tier: adaptive when nothing is below it, chain-lru
// when an SSD or remote tier is (there adaptive lost hits and wrote more: hit_ratio_bench, issue
// 54). Any other name is itself.
std::string_view resolve_eviction_policy(std::string_view name, bool tier_below);

}  // namespace kvtier
