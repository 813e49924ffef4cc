#include "tiers/gpu_tier.h"

#include <chrono>
#include <cstring>

#include "base/elapsed.h"

namespace kvtier {

Result<std::unique_ptr<GpuTier>> GpuTier::create(VulkanContext& ctx, GpuBlockPool& pool) {
  KVTIER_ASSIGN_OR_RETURN(auto transfer, HostTransfer::create(ctx, pool));
  return std::unique_ptr<GpuTier>(new GpuTier(pool, std::move(transfer)));
}

GpuTier::GpuTier(GpuBlockPool& pool, std::unique_ptr<HostTransfer> transfer)
    : pool_(pool), transfer_(std::move(transfer)) {}

void GpuTier::count(const HostTransfer::Counts& c, bool to_device) {
  (to_device ? metrics_.direct_up : metrics_.direct_down).inc(c.direct);
  metrics_.import_failures.inc(c.import_failures);
  metrics_.copy_regions.inc(c.copy_regions);
}

Result<std::vector<BlockRef>> GpuTier::download(std::span<const int32_t> ids,
                                                std::span<const BlockIdentity> identities) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Block> blocks;
  for (size_t i = 0; i < ids.size(); ++i) blocks.push_back(Block::dense_uninitialized(pool_.layout_ptr(), identities[i]));
  HostTransfer::Counts counts;
  const Status st = transfer_->download(ids, blocks, counts);
  count(counts, /*to_device=*/false);
  KVTIER_RETURN_IF_ERROR(st);
  std::vector<BlockRef> out;
  for (Block& b : blocks) out.push_back(std::make_shared<const Block>(std::move(b)));
  metrics_.downloads.inc(ids.size());
  metrics_.bytes_down.inc(ids.size() * pool_.block_bytes());
  metrics_.download_seconds.observe(seconds_since(t0));
  return out;
}

Status GpuTier::upload(std::span<const BlockRef> blocks, std::span<const size_t> todo, std::span<const int32_t> ids) {
  HostTransfer::Counts counts;
  const Status st = transfer_->upload(blocks, todo, ids, counts);
  count(counts, /*to_device=*/true);
  return st;
}

Result<std::vector<int32_t>> GpuTier::allocate(uint32_t n) {
  std::vector<BlockRef> evicted;
  std::vector<int32_t> ids;
  const EraseFence::Move eviction = begin_eviction();  // victims are carried from here to the sink
  {
    std::lock_guard lock(transfer_mu_);
    KVTIER_ASSIGN_OR_RETURN(GpuBlockPool::Allocation a, pool_.allocate(n));
    ids = std::move(a.ids);
    if (!a.evicted.empty()) {
      // Save the evicted contents before anyone writes into these blocks.
      std::vector<int32_t> eids;
      std::vector<BlockIdentity> identities;
      {
        std::lock_guard leaving(leaving_mu_);
        for (auto& e : a.evicted) {
          eids.push_back(e.id);
          leaving_.emplace(e.identity.hash, nullptr);
          identities.push_back(std::move(e.identity));
        }
      }
      auto saved = download(eids, identities);
      std::lock_guard leaving(leaving_mu_);
      if (!saved.ok()) {
        metrics_.transfer_failures.inc();
        for (const BlockIdentity& id : identities) leaving_.erase(id.hash);
        for (int32_t id : ids) pool_.unref(id);
        return saved.status().with_context("gpu tier: saving evicted blocks");
      }
      evicted = std::move(saved).value();
      for (const BlockRef& b : evicted) {
        // Erased during the download: it goes no further (the fence refuses it below too).
        if (auto it = leaving_.find(b->hash()); it != leaving_.end()) it->second = b;
      }
      metrics_.evictions.inc(evicted.size());
    }
  }
  std::vector<BlockRef> handed = evicted;
  evict_to_sink(evicted);
  std::lock_guard leaving(leaving_mu_);
  for (const BlockRef& b : handed) {
    // Only this eviction's entry: the hash may have come back and left again since.
    if (auto it = leaving_.find(b->hash()); it != leaving_.end() && it->second == b) leaving_.erase(it);
  }
  return ids;
}

std::optional<int32_t> GpuTier::publish(int32_t id, BlockIdentity identity) {
  return pool_.cache(id, std::move(identity));
}

void GpuTier::release(std::span<const int32_t> ids) {
  for (int32_t id : ids) pool_.unref(id);
}

Result<InsertOutcome> GpuTier::insert(BlockRef block) {
  return std::move(insert_many(std::span<const BlockRef>(&block, 1)).front());
}

bool GpuTier::accepts(const KvLayout& layout) const {
  return layout.fingerprint() == pool_.layout().fingerprint();
}

std::vector<Result<InsertOutcome>> GpuTier::insert_many(std::span<const BlockRef> blocks) {
  std::vector<Result<InsertOutcome>> out(blocks.size(), InsertOutcome::kAlreadyPresent);
  std::vector<size_t> todo;
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (blocks[i]->layout().fingerprint() != pool_.layout().fingerprint()) {
      metrics_.rejected.inc();
      out[i] = invalid_argument("gpu tier: block " + blocks[i]->hash().hex() +
                                " is of another layout than the GPU pool's");
    } else if (pool_.find(blocks[i]->hash()) >= 0) {
      metrics_.duplicate_inserts.inc();
    } else {
      todo.push_back(i);
    }
  }
  if (todo.empty()) return out;
  auto ids = allocate(static_cast<uint32_t>(todo.size()));
  if (!ids.ok()) {
    metrics_.rejected.inc(todo.size());
    for (size_t i : todo) out[i] = ids.status();
    return out;
  }
  const auto t0 = std::chrono::steady_clock::now();
  Status st;
  {
    std::lock_guard lock(transfer_mu_);
    st = upload(blocks, todo, *ids);
  }
  if (!st.ok()) {
    metrics_.transfer_failures.inc();
    failure_log_.error("gpu tier: upload of {} blocks failed: {}", todo.size(), st.to_string());
    release(*ids);
    for (size_t i : todo) out[i] = st;
    return out;
  }
  metrics_.uploads.inc(todo.size());
  metrics_.bytes_up.inc(todo.size() * pool_.block_bytes());
  metrics_.upload_seconds.observe(seconds_since(t0));
  for (size_t k = 0; k < todo.size(); ++k) {
    const int32_t id = (*ids)[k];
    const std::optional<int32_t> held =
        pool_.cache(id, blocks[todo[k]]->identity(), [this](const BlockHash& h) { return refuse_erased(h); });
    if (held == -1) {
      out[todo[k]] = failed_precondition("gpu tier: block " + blocks[todo[k]]->hash().hex() +
                                         " was erased while it was being moved here");
    } else if (held) {
      metrics_.duplicate_inserts.inc();  // published by someone else meanwhile
    } else {
      metrics_.inserts.inc();
      out[todo[k]] = InsertOutcome::kInserted;
    }
    pool_.unref(id);  // cached, free, most recently used
  }
  return out;
}

bool GpuTier::contains(const BlockHash& hash) const {
  if (pool_.find(hash) >= 0) return true;
  std::lock_guard lock(leaving_mu_);
  return leaving_.count(hash) > 0;
}

BlockRef GpuTier::leaving_block(const BlockHash& hash) {
  {
    std::lock_guard lock(leaving_mu_);
    if (leaving_.empty()) return nullptr;
  }
  std::lock_guard transfers(transfer_mu_);  // a download of it in progress is done after this
  std::lock_guard lock(leaving_mu_);
  auto it = leaving_.find(hash);
  return it == leaving_.end() ? nullptr : it->second;
}

Tier::Presence GpuTier::probe(const BlockRequest& request) const {
  const int32_t id = pool_.find(request.hash);
  if (id < 0) {
    std::lock_guard lock(leaving_mu_);
    auto it = leaving_.find(request.hash);
    if (it == leaving_.end()) return Presence::kAbsent;
    if (!it->second) return Presence::kUnverified;  // its download is still running
    return request.tokens_match(it->second->identity().token_ids) ? Presence::kSameTokens
                                                                   : Presence::kDifferentTokens;
  }
  auto ident = pool_.identity(id);
  if (!ident || ident->hash != request.hash) return Presence::kAbsent;  // reused meanwhile
  return request.tokens_match(ident->token_ids) ? Presence::kSameTokens : Presence::kDifferentTokens;
}

Result<BlockRef> GpuTier::read(const BlockRequest& request) {
  return std::move(read_many(std::span<const BlockRequest>(&request, 1)).front());
}

std::vector<Result<BlockRef>> GpuTier::read_many(std::span<const BlockRequest> requests) {
  std::vector<Result<BlockRef>> out;
  std::vector<int32_t> ids;
  std::vector<BlockIdentity> identities;
  std::vector<size_t> where;
  for (size_t i = 0; i < requests.size(); ++i) {
    out.emplace_back(not_found("gpu tier: not held"));
    const int32_t id = pool_.find_and_ref(requests[i].hash);  // held while it is copied
    if (id < 0) {
      if (BlockRef b = leaving_block(requests[i].hash); b && requests[i].tokens_match(b->identity().token_ids)) {
        out.back() = b;  // evicted, on its way to the tier below: its saved bytes
      }
      continue;
    }
    auto ident = pool_.identity(id);
    if (!ident || !requests[i].tokens_match(ident->token_ids)) {
      pool_.unref(id);
      continue;
    }
    ids.push_back(id);
    identities.push_back(std::move(*ident));
    where.push_back(i);
  }
  if (!ids.empty()) {
    Result<std::vector<BlockRef>> got = internal_error("unset");
    {
      std::lock_guard lock(transfer_mu_);
      got = download(ids, identities);
    }
    for (int32_t id : ids) pool_.unref(id);
    if (!got.ok()) {
      metrics_.transfer_failures.inc();
      for (size_t w : where) out[w] = got.status();
    } else {
      for (size_t k = 0; k < where.size(); ++k) out[where[k]] = (*got)[k];
    }
  }
  return out;
}

bool GpuTier::erase(const BlockHash& hash) {
  const bool cached = pool_.uncache(hash);
  std::lock_guard lock(leaving_mu_);
  return leaving_.erase(hash) > 0 || cached;
}

bool GpuTier::pin(const BlockHash& hash) {
  std::lock_guard lock(pin_mu_);
  auto it = pinned_.find(hash);
  if (it != pinned_.end()) {
    pool_.ref(it->second.first);
    ++it->second.second;
    return true;
  }
  const int32_t id = pool_.find_and_ref(hash);
  if (id < 0) return false;
  pinned_.emplace(hash, std::make_pair(id, 1));
  return true;
}

void GpuTier::unpin(const BlockHash& hash) {
  std::lock_guard lock(pin_mu_);
  auto it = pinned_.find(hash);
  if (it == pinned_.end()) return;
  pool_.unref(it->second.first);
  if (--it->second.second == 0) pinned_.erase(it);
}

std::vector<bool> GpuTier::contains_many(std::span<const BlockHash> hashes) const {
  std::vector<bool> out = pool_.contains_many(hashes);
  std::lock_guard lock(leaving_mu_);
  if (leaving_.empty()) return out;
  for (size_t i = 0; i < hashes.size(); ++i) out[i] = out[i] || leaving_.count(hashes[i]) > 0;
  return out;
}

// pin() for a whole prefix: the pool's books taken once, the tokens compared where they lie
// (probe() copies the block's identity). H100 host, a 2047-block prefix: 0.62 ms pinned block by
// block, 0.27 ms this way (cache_bench, docs/benchmarks.md). The pins are the pool's references
// alone, given back by slot (unpin_pinned).
std::vector<Tier::PinResult> GpuTier::pin_many(std::span<const BlockRequest> requests) {
  std::vector<BlockHash> hashes;
  std::vector<std::span<const uint32_t>> tokens;
  hashes.reserve(requests.size());
  tokens.reserve(requests.size());
  for (const BlockRequest& r : requests) {
    hashes.push_back(r.hash);
    tokens.push_back(r.tokens);
  }
  std::vector<PinResult> out(requests.size());
  const std::vector<GpuBlockPool::Found> found = pool_.find_and_ref_many(hashes, tokens);
  for (size_t i = 0; i < found.size(); ++i) {
    if (found[i].id < 0) continue;
    out[i].pinned = true;
    out[i].slot = found[i].id;
    out[i].presence = found[i].same_tokens ? Presence::kSameTokens : Presence::kDifferentTokens;
  }
  return out;
}

void GpuTier::unpin_pinned(std::span<const BlockHash>, std::span<const int32_t> slots) {
  std::vector<int32_t> ids;
  ids.reserve(slots.size());
  for (const int32_t id : slots) {
    if (id >= 0) ids.push_back(id);
  }
  pool_.unref_many(ids);
}

void GpuTier::unpin_many(std::span<const BlockHash> hashes) {
  std::vector<int32_t> ids;
  ids.reserve(hashes.size());
  std::lock_guard lock(pin_mu_);
  for (const BlockHash& h : hashes) {
    auto it = pinned_.find(h);
    if (it == pinned_.end()) continue;
    ids.push_back(it->second.first);
    if (--it->second.second == 0) pinned_.erase(it);
  }
  pool_.unref_many(ids);
}

std::optional<int32_t> GpuTier::device_slot(const BlockHash& hash) const {
  {
    std::lock_guard lock(pin_mu_);
    auto it = pinned_.find(hash);
    if (it != pinned_.end()) return it->second.first;
  }
  const int32_t id = pool_.find(hash);
  return id < 0 ? std::nullopt : std::optional<int32_t>(id);
}

uint64_t GpuTier::capacity_bytes() const { return pool_.num_blocks() * pool_.block_bytes(); }

uint64_t GpuTier::used_bytes() const {
  // Cached blocks plus blocks in use (a block in use may also be cached: count it once).
  return std::min<uint64_t>(pool_.num_blocks(), pool_.cached_blocks() + pool_.blocks_in_use()) *
         pool_.block_bytes();
}

void GpuTier::visit_metrics(MetricVisitor& v) const {
  const MetricLabels t{{"tier", "gpu"}};
  v.counter("kvtier_tier_inserts_total", "Blocks stored in the tier", t, metrics_.inserts.value());
  v.counter("kvtier_tier_duplicate_inserts_total", "Inserts of a block the tier already held", t,
            metrics_.duplicate_inserts.value());
  v.counter("kvtier_tier_rejected_total", "Inserts refused", {{"tier", "gpu"}, {"reason", "no_room_or_layout"}},
            metrics_.rejected.value());
  v.counter("kvtier_tier_evictions_total", "Blocks evicted to the tier below", t, metrics_.evictions.value());
  v.counter("kvtier_gpu_uploads_total", "Blocks copied host to GPU", {}, metrics_.uploads.value());
  v.counter("kvtier_gpu_downloads_total", "Blocks copied GPU to host", {}, metrics_.downloads.value());
  v.counter("kvtier_gpu_upload_bytes_total", "Bytes copied host to GPU", {}, metrics_.bytes_up.value());
  v.counter("kvtier_gpu_download_bytes_total", "Bytes copied GPU to host", {}, metrics_.bytes_down.value());
  v.counter("kvtier_gpu_transfer_failures_total", "Uploads or downloads that failed", {},
            metrics_.transfer_failures.value());
  v.counter("kvtier_gpu_direct_blocks_total", "Blocks the GPU copied from or into host memory where they lie, without a CPU copy",
            {{"direction", "up"}}, metrics_.direct_up.value());
  v.counter("kvtier_gpu_direct_blocks_total", "Blocks the GPU copied from or into host memory where they lie, without a CPU copy",
            {{"direction", "down"}}, metrics_.direct_down.value());
  v.counter("kvtier_gpu_host_import_failures_total", "Chunks of host memory the GPU could not import (their blocks are staged)",
            {}, metrics_.import_failures.value());
  v.counter("kvtier_gpu_copy_regions_total", "Regions of host-GPU copy commands (adjacent blocks share one)", {},
            metrics_.copy_regions.value());
  v.gauge("kvtier_gpu_host_imported_bytes", "Host memory imported for direct copies", {},
          static_cast<double>(transfer_->imported_bytes()));
  v.histogram("kvtier_gpu_upload_seconds", "Upload batch latency", {}, metrics_.upload_seconds.snapshot());
  v.histogram("kvtier_gpu_download_seconds", "Download batch latency", {}, metrics_.download_seconds.snapshot());
  v.gauge("kvtier_tier_used_bytes", "Bytes held", t, static_cast<double>(used_bytes()));
  v.gauge("kvtier_tier_capacity_bytes", "Capacity", t, static_cast<double>(capacity_bytes()));
  v.gauge("kvtier_tier_blocks", "Blocks held", t, static_cast<double>(pool_.cached_blocks()));
  v.gauge("kvtier_gpu_blocks_in_use", "GPU blocks referenced by running requests", {},
          static_cast<double>(pool_.blocks_in_use()));
}

}  // namespace kvtier
