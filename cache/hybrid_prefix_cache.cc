#include "cache/hybrid_prefix_cache.h"

#include <algorithm>

#include "serialize/state_record.h"

namespace kvtier {

Result<std::unique_ptr<HybridPrefixCache>> HybridPrefixCache::create(TieredCache& cache, PrefixHasher hasher,
                                                                     HybridLayout layout, LayoutRegistry& layouts) {
  if (layout.gdn_layers() == 0) {
    return invalid_argument("hybrid prefix cache: " + layout.name() + " has no GDN layer (use the plain cache)");
  }
  if (hasher.block_size() != layout.attention().block_size) {
    return invalid_argument("hybrid prefix cache: the hasher's block size is not the layout's");
  }
  KVTIER_ASSIGN_OR_RETURN(auto snapshot, layouts.add(kvtier::snapshot_layout(layout)));
  std::unique_ptr<HybridPrefixCache> c(
      new HybridPrefixCache(cache, std::move(hasher), std::move(layout), std::move(snapshot)));
  c->listener_ = cache.add_drop_listener([p = c.get()](const BlockRef& b) { p->on_dropped(b); });
  return c;
}

HybridPrefixCache::~HybridPrefixCache() { cache_.remove_drop_listener(listener_); }

HybridPrefixCache::HybridPrefixCache(TieredCache& cache, PrefixHasher hasher, HybridLayout layout,
                                     std::shared_ptr<const KvLayout> snapshot_layout)
    : cache_(cache), hasher_(std::move(hasher)), layout_(std::move(layout)),
      snapshot_layout_(std::move(snapshot_layout)), fingerprint_tag_("hybrid=" + layout_.fingerprint_hex()) {}

Result<InsertOutcome> HybridPrefixCache::store_snapshot(std::span<const BlockKey> keys, size_t block,
                                                        std::span<const std::string> extra_keys,
                                                        std::span<const uint8_t> snapshot) {
  if (block >= keys.size()) return invalid_argument("store_snapshot: block past the prompt's full blocks");
  const std::vector<BlockKey> prefix(keys.begin(), keys.begin() + block + 1);
  return store_snapshot(hasher_.identity(prefix, block, extra_keys), (block + 1) * hasher_.block_size(), snapshot);
}

Result<InsertOutcome> HybridPrefixCache::store_snapshot(const BlockIdentity& kv, uint64_t prefix_tokens,
                                                        std::span<const uint8_t> snapshot) {
  auto record = make_state_record(layout_, snapshot_layout_, kv, hasher_.snapshot_key(kv.hash), prefix_tokens, snapshot);
  if (!record.ok()) {
    metrics_.snapshots_refused.inc();
    return record.status();
  }
  auto r = cache_.insert(std::make_shared<const Block>(std::move(*record)));
  if (!r.ok()) {
    metrics_.snapshots_refused.inc();
    refused_log_.warn("snapshot at block {} not stored: {}", kv.hash.hex(), r.status().to_string());
    return r;
  }
  if (*r == InsertOutcome::kInserted) {
    metrics_.snapshots_stored.inc();
    metrics_.snapshot_bytes_stored.inc(snapshot.size());
  } else {
    metrics_.snapshots_already_present.inc();
  }
  return r;
}

HybridLookup HybridPrefixCache::lookup(std::span<const BlockKey> keys) {
  metrics_.lookups.inc();
  HybridLookup out;
  LookupResult kv = cache_.lookup(keys);
  out.kv_blocks = kv.blocks.size();
  if (kv.blocks.empty()) return out;
  // Every candidate's snapshot key, asked of each tier at once (one index lookup on the SSD, one
  // round trip to a shared tier).
  std::vector<BlockHash> snapshot_keys(kv.blocks.size());
  for (size_t i = 0; i < kv.blocks.size(); ++i) snapshot_keys[i] = hasher_.snapshot_key(kv.blocks[i].hash);
  const std::vector<bool> present = held(snapshot_keys);
  size_t n = present.size();
  while (n > 0 && !present[n - 1]) --n;
  if (n == 0) {
    metrics_.lookups_kv_without_snapshot.inc();
    return out;
  }
  metrics_.lookup_hits.inc();
  out.blocks = n;
  out.matched_tokens = n * static_cast<size_t>(hasher_.block_size());
  out.hits.assign(kv.blocks.begin(), kv.blocks.begin() + n);
  return out;
}

std::vector<bool> HybridPrefixCache::held(std::span<const BlockHash> snapshot_keys) const {
  std::vector<bool> present(snapshot_keys.size(), false);
  for (const auto& tier : cache_.tiers()) {
    if (!tier->accepts(*snapshot_layout_)) continue;
    const std::vector<bool> here = tier->contains_many(snapshot_keys);
    for (size_t i = 0; i < here.size(); ++i) present[i] = present[i] || here[i];
  }
  return present;
}

bool HybridPrefixCache::has_snapshot(std::span<const BlockKey> keys, size_t block) const {
  if (block >= keys.size()) return false;
  const BlockHash key = hasher_.snapshot_key(keys[block].hash);
  return held(std::span(&key, 1)).front();
}

Result<BlockRef> HybridPrefixCache::read_record(const BlockHash& block_hash, std::span<const uint32_t> tokens) {
  metrics_.snapshot_reads.inc();
  const BlockRequest req{hasher_.snapshot_key(block_hash), tokens};
  auto record = cache_.read_record(req);
  Status st = record.status();
  if (record.ok()) {
    if ((*record)->identity().parent_hash != block_hash) {
      st = corruption("state record " + req.hash.hex() + " names another block as its own");
    } else {
      st = snapshot_of(layout_, **record).status();  // layout, tag and padding checked
    }
  }
  if (st.ok()) return record;
  metrics_.snapshot_read_failures.inc();
  read_failure_log_.warn("snapshot at block {} not restored: {}", block_hash.hex(), st.to_string());
  return st;
}

Result<AlignedBuffer> HybridPrefixCache::fetch_snapshot(std::span<const BlockKey> keys, size_t block) {
  if (block >= keys.size()) return invalid_argument("fetch_snapshot: block past the prompt's full blocks");
  KVTIER_ASSIGN_OR_RETURN(BlockRef record, read_record(keys[block].hash, keys[block].tokens));
  return snapshot_of(layout_, *record);
}

Result<bool> HybridPrefixCache::erase_snapshot(const BlockHash& block_hash) {
  auto held = cache_.erase(hasher_.snapshot_key(block_hash));
  if (held.ok() && *held) metrics_.snapshots_deleted.inc();
  return held;
}

void HybridPrefixCache::on_dropped(const BlockRef& block) {
  if (is_state_record(*block)) {
    const auto& keys = block->identity().extra_keys;
    if (keys.size() > 1 && keys[1] == fingerprint_tag_) metrics_.snapshots_evicted.inc();
    return;
  }
  if (block->layout().fingerprint() != layout_.attention().fingerprint()) return;  // another model's
  // The snapshot ending at this block cannot be used without it: it goes too.
  const BlockHash key = hasher_.snapshot_key(block->hash());
  if (cache_.presence(BlockRequest{key, {}}) == Tier::Presence::kAbsent) return;
  if (auto erased = cache_.erase(key); erased.ok() && *erased) {
    metrics_.snapshots_erased_with_block.inc();
  }
}

void HybridPrefixCache::visit_metrics(MetricVisitor& v) const {
  const MetricLabels l{{"layout", layout_.name()}};
  v.counter("kvtier_hybrid_snapshots_stored_total", "State snapshots stored", l, metrics_.snapshots_stored.value());
  v.counter("kvtier_hybrid_snapshot_bytes_stored_total", "Bytes of state snapshots stored", l,
            metrics_.snapshot_bytes_stored.value());
  v.counter("kvtier_hybrid_snapshots_already_present_total", "Snapshots offered that were held already", l,
            metrics_.snapshots_already_present.value());
  v.counter("kvtier_hybrid_snapshots_refused_total", "Snapshots not stored (bad size, no tier took them)", l,
            metrics_.snapshots_refused.value());
  v.counter("kvtier_hybrid_lookups_total", "Hybrid prefix lookups", l, metrics_.lookups.value());
  v.counter("kvtier_hybrid_snapshot_hits_total", "Lookups that ended at a snapshot", l, metrics_.lookup_hits.value());
  v.counter("kvtier_hybrid_lookups_without_snapshot_total",
            "Lookups that found KV blocks but no snapshot at or before their end", l,
            metrics_.lookups_kv_without_snapshot.value());
  v.counter("kvtier_hybrid_snapshot_reads_total", "Snapshots read for a restore", l, metrics_.snapshot_reads.value());
  v.counter("kvtier_hybrid_snapshot_read_failures_total", "Snapshots found but not readable intact", l,
            metrics_.snapshot_read_failures.value());
  v.counter("kvtier_hybrid_snapshots_evicted_total", "Snapshots gone from the local tiers, by reason",
            {{"layout", layout_.name()}, {"reason", "evicted"}}, metrics_.snapshots_evicted.value());
  v.counter("kvtier_hybrid_snapshots_evicted_total", "Snapshots gone from the local tiers, by reason",
            {{"layout", layout_.name()}, {"reason", "block_dropped"}}, metrics_.snapshots_erased_with_block.value());
  v.counter("kvtier_hybrid_snapshots_deleted_total", "Snapshots erased with their block by a delete", l,
            metrics_.snapshots_deleted.value());
}

}  // namespace kvtier
