// RamTier: blocks in host memory, bounded by bytes; when full, the eviction policy's victims go to
// the eviction sink (normally the SSD tier). The policy is one of tiers/policy (chain-lru by
// default: least recently used, leaves of chains first). Optionally keeps blocks affine-quantized
// (8 or 4 bits, lossy, off by default) to hold 2-4x more; quantized blocks are dequantized before
// they leave for SSD (by the SSD tier, on the evicting thread).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "base/log.h"
#include "tiers/policy/eviction_policy.h"
#include "tiers/namespace_usage.h"
#include "tiers/tier.h"

namespace kvtier {

struct RamTierOptions {
  uint64_t capacity_bytes = 1ull << 30;
  // When set, dense blocks are quantized on insert. Blocks holding inf/NaN stay dense (counted).
  std::optional<Quantization> quantization;
  std::string name = "ram";  // distinguishes several RAM tiers in metrics
  // A name make_eviction_policy() knows (the caller checks it: the tier asserts).
  std::string eviction = "chain-lru";
  // Bytes a namespace may hold here. An insert that would take its namespace past its quota is
  // refused (kNoSpace), changing nothing; its blocks leave as eviction or erases take them.
  std::map<std::string, uint64_t, std::less<>> namespace_quotas;
};

struct RamTierMetrics {
  Counter inserts;
  Counter duplicate_inserts;
  Counter rejected_no_room;   // everything pinned, or a block larger than the tier
  Counter rejected_quota;     // its namespace would pass its quota
  Counter evictions;
  Counter hits;
  Counter misses;
  Counter quantized_inserts;
  Counter quantize_skipped;   // blocks with non-finite values, kept dense
  Counter orphans_demoted;    // handed down because their parent had left (chain-aware policies)
  Gauge used_bytes;
  Gauge blocks;
  Gauge pinned_blocks;
};

// Thread-safe. One mutex guards the index and the policy; it is never held while block data is
// touched (blocks are immutable and shared) or while evicted blocks are handed down.
class RamTier final : public Tier {
 public:
  explicit RamTier(RamTierOptions options);

  std::string_view name() const override { return options_.name; }
  Result<InsertOutcome> insert(BlockRef block) override;
  bool contains(const BlockHash& hash) const override;
  std::vector<bool> contains_many(std::span<const BlockHash> hashes) const override;  // one lock
  Presence probe(const BlockRequest& request) const override;
  Result<BlockRef> read(const BlockRequest& request) override;
  bool erase(const BlockHash& hash) override;
  bool pin(const BlockHash& hash) override;
  void unpin(const BlockHash& hash) override;
  // One lock for the batch, each block read with its pin: a 511-block prefix took ~0.2 ms of
  // pins and reads block by block on the H200 host, on the way to the engine's first kernel.
  std::vector<PinResult> pin_many(std::span<const BlockRequest> requests) override;
  uint64_t capacity_bytes() const override { return options_.capacity_bytes; }
  uint64_t used_bytes() const override;
  size_t block_count() const override;
  void visit_metrics(MetricVisitor& visitor) const override;

  const RamTierMetrics& metrics() const { return metrics_; }
  std::string_view eviction_policy() const;
  // The policy choosing victims now (for adaptive, the candidate it follows) and how often that
  // changed.
  std::string eviction_policy_active() const;
  uint64_t eviction_policy_changes() const;
  // Hashes of the unpinned blocks, for tests and debugging.
  size_t unpinned_count() const;
  // Every block held, pinned or not. For shutdown, which writes what only RAM holds to the SSD.
  std::vector<BlockRef> blocks() const;

 private:
  // Takes an unpinned block out for the sink (caller holds mu_ and hands `victims` down).
  void evict_locked(const BlockHash& hash, std::vector<BlockRef>& victims);
  // Hands every orphan the policy names to `victims` (caller holds mu_ and gives them to the sink).
  void demote_orphans_locked(std::vector<BlockRef>& victims);
  bool erase_locked(const BlockHash& hash, BlockRef& dropped);
  // Hands `victims` to the sink, then forgets them as leaving (see leaving_).
  void sink_victims(std::vector<BlockRef>& victims);
  // A victim between index_ and the sink, or nullptr.
  const BlockRef* leaving_locked(const BlockHash& hash) const;
  void release_locked(const Block& block, uint64_t bytes);

  struct Entry {
    BlockRef block;
    uint64_t bytes = 0;
    int pins = 0;
  };
  void pin_locked(const BlockHash& hash, Entry& e);  // one more pin of a held block

  const RamTierOptions options_;
  mutable std::mutex mu_;  // guards index_, leaving_, policy_, used_, unpinned_bytes_
  std::unordered_map<BlockHash, Entry> index_;
  // Victims taken out of index_ and not yet taken by the sink (which runs outside mu_): still
  // found and read here, so a block on its way down is never in no tier at all (a reader that
  // looked in that gap missed a block nobody had deleted). Not pinnable: pins are for index_.
  std::unordered_map<BlockHash, BlockRef> leaving_;
  std::unique_ptr<EvictionPolicy> policy_;
  uint64_t used_ = 0;
  uint64_t unpinned_bytes_ = 0;  // what eviction could free
  NamespaceUsage namespaces_;  // quotas: charged and released under mu_, with the rest
  RamTierMetrics metrics_;
  LogThrottle quantize_skip_log_;
  // Adaptive eviction's changes of the candidate it follows: each logged (at most one line a
  // minute, the rest counted into it), beside kvtier_ram_eviction_changes_total.
  uint64_t policy_changes_logged_ = 0;  // guarded by mu_
  LogThrottle policy_change_log_{std::chrono::minutes(1)};
};

}  // namespace kvtier
