// HybridPrefixCache: prefix caching for hybrid models (Gated DeltaNet layers beside attention)
// on a TieredCache. A prefix is restorable only where every GDN layer's state was
// snapshotted at its end, so a lookup ends at the last block of the cached KV prefix that has a
// snapshot; the tokens after it are computed. Snapshots are state records (serialize/
// state_record.h) keyed by PrefixHasher::snapshot_key of the block they end at, stored in the same
// tiers as the blocks (RAM, SSD, Redis; the GPU pool holds KV only). When a KV block is evicted
// off the last local tier, its snapshot is erased with it. Not when the SSD reclaims a whole
// segment (that drops its entries without evicting them one by one): a snapshot can then sit
// until its own segment goes, unused — a lookup needs its blocks too, so it is never served alone.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/memory/aligned_buffer.h"
#include "base/metrics/metrics.h"
#include "cache/prefix_hasher.h"
#include "cache/tiered_cache.h"
#include "serialize/hybrid_layout.h"
#include "serialize/layout_registry.h"

namespace kvtier {

struct HybridLookup {
  size_t blocks = 0;          // blocks of the restorable prefix: it ends at a snapshot
  size_t matched_tokens = 0;  // blocks * block_size
  size_t kv_blocks = 0;       // the cached KV prefix, which may go on past the last snapshot
  std::vector<LookupResult::Hit> hits;  // the restorable prefix's blocks, in order
};

struct HybridCacheMetrics {
  Counter snapshots_stored;
  Counter snapshot_bytes_stored;
  Counter snapshots_already_present;
  Counter snapshots_refused;       // no tier took it, or a bad snapshot
  Counter lookups;
  Counter lookup_hits;             // lookups that ended at a snapshot
  Counter lookups_kv_without_snapshot;  // KV blocks found, no snapshot at or before their end
  Counter snapshot_reads;
  Counter snapshot_read_failures;  // found by lookup, not readable intact at fetch
  Counter snapshots_evicted;       // fell off the last local tier themselves
  Counter snapshots_erased_with_block;  // erased because their block fell off
  Counter snapshots_deleted;       // erased with their block by a DELETE
};

// Thread-safe (the cache is; metrics are atomic). It listens to the cache's drops from creation
// until it is destroyed.
class HybridPrefixCache {
 public:
  // Registers the hybrid's snapshot layout in `layouts` (the registry the SSD and remote tiers
  // decode with), so records read back from them are recognised.
  static Result<std::unique_ptr<HybridPrefixCache>> create(TieredCache& cache, PrefixHasher hasher,
                                                           HybridLayout layout, LayoutRegistry& layouts);

  const HybridLayout& layout() const { return layout_; }
  TieredCache& cache() { return cache_; }
  const PrefixHasher& hasher() const { return hasher_; }
  const std::shared_ptr<const KvLayout>& snapshot_layout() const { return snapshot_layout_; }
  ~HybridPrefixCache();
  HybridPrefixCache(const HybridPrefixCache&) = delete;
  HybridPrefixCache& operator=(const HybridPrefixCache&) = delete;

  // Stores the snapshot taken at the end of block `block` of `keys` (a prompt's keys, from the
  // first block). kAlreadyPresent when that block has one. invalid_argument for a snapshot of
  // another size; what no tier can take is counted and returned.
  Result<InsertOutcome> store_snapshot(std::span<const BlockKey> keys, size_t block,
                                       std::span<const std::string> extra_keys, std::span<const uint8_t> snapshot);
  // The same for the block `kv` identifies (of any namespace; a server has the block's identity
  // from the block itself), the end of a prefix of `prefix_tokens` tokens.
  Result<InsertOutcome> store_snapshot(const BlockIdentity& kv, uint64_t prefix_tokens,
                                       std::span<const uint8_t> snapshot);
  // The record of the snapshot at the end of block `block_hash` (checked against `tokens` when
  // given), read where it lies: what a server returns. kNotFound when no tier returns it intact.
  Result<BlockRef> read_record(const BlockHash& block_hash, std::span<const uint32_t> tokens = {});
  // The longest cached KV prefix of `keys` cut back to its last block with a snapshot.
  HybridLookup lookup(std::span<const BlockKey> keys);
  // The snapshot at the end of keys[block], checked against the block's tokens; kNotFound when
  // no tier returns it intact (counted).
  Result<AlignedBuffer> fetch_snapshot(std::span<const BlockKey> keys, size_t block);
  // Erases the snapshot at the end of block `block_hash` from every tier (its block was deleted).
  // True if a tier held it; TieredCache::erase's error when one could not let it go.
  Result<bool> erase_snapshot(const BlockHash& block_hash);
  // Whether keys[block] has a snapshot in any tier (a shared one asked too).
  bool has_snapshot(std::span<const BlockKey> keys, size_t block) const;

  const HybridCacheMetrics& metrics() const { return metrics_; }
  // kvtier_hybrid_*; `labels` name the layout.
  void visit_metrics(MetricVisitor& visitor) const;

 private:
  HybridPrefixCache(TieredCache& cache, PrefixHasher hasher, HybridLayout layout,
                    std::shared_ptr<const KvLayout> snapshot_layout);
  void on_dropped(const BlockRef& block);
  // Per key, whether any tier that takes state records holds it (each tier asked once, for all).
  std::vector<bool> held(std::span<const BlockHash> snapshot_keys) const;

  TieredCache& cache_;
  PrefixHasher hasher_;
  HybridLayout layout_;
  std::shared_ptr<const KvLayout> snapshot_layout_;
  std::string fingerprint_tag_;  // the record's second extra key
  HybridCacheMetrics metrics_;
  LogThrottle refused_log_;
  LogThrottle read_failure_log_;
  size_t listener_ = 0;
};

}  // namespace kvtier
