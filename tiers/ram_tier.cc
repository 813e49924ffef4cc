#include "tiers/ram_tier.h"

#include <algorithm>
#include <cassert>

#include "base/byte_size.h"
#include "serialize/block_hash_format.h"
#include "serialize/state_record.h"

namespace kvtier {

RamTier::RamTier(RamTierOptions options)
    : options_(std::move(options)), namespaces_(options_.name, options_.namespace_quotas) {
  auto policy = make_eviction_policy(options_.eviction);
  assert(policy.ok() && "RamTierOptions::eviction names no policy");
  policy_ = std::move(policy).value();
  policy_->set_capacity(options_.capacity_bytes);
}

void RamTier::release_locked(const Block& block, uint64_t bytes) {
  namespaces_.add(block.identity().namespace_id, -static_cast<int64_t>(bytes));
}

std::string_view RamTier::eviction_policy() const { return policy_->name(); }

std::string RamTier::eviction_policy_active() const {
  std::lock_guard lock(mu_);
  return std::string(policy_->active());
}

uint64_t RamTier::eviction_policy_changes() const {
  std::lock_guard lock(mu_);
  return policy_->active_changes();
}

Result<InsertOutcome> RamTier::insert(BlockRef block) {
  if (contains(block->hash())) {
    metrics_.duplicate_inserts.inc();
    return InsertOutcome::kAlreadyPresent;
  }
  // Quantize outside the lock: it reads the whole block.
  if (options_.quantization && !block->any_quantized()) {
    auto q = block->quantized(*options_.quantization);
    if (q.ok()) {
      block = std::make_shared<const Block>(std::move(q).value());
      metrics_.quantized_inserts.inc();
    } else {
      metrics_.quantize_skipped.inc();
      quantize_skip_log_.warn("{} tier: block {} kept dense: {}", options_.name, block->hash(),
                              q.status().message());
    }
  }
  const uint64_t bytes = block->size_bytes();
  if (bytes > options_.capacity_bytes) {
    metrics_.rejected_no_room.inc();
    return invalid_argument(options_.name + " tier: block of " + format_byte_size(bytes) +
                            " exceeds the tier's capacity of " +
                            format_byte_size(options_.capacity_bytes));
  }
  std::vector<BlockRef> victims;
  const EraseFence::Move eviction = begin_eviction();  // victims are carried from here to the sink
  {
    std::lock_guard lock(mu_);
    if (index_.count(block->hash())) {
      metrics_.duplicate_inserts.inc();
      return InsertOutcome::kAlreadyPresent;
    }
    if (refuse_erased(block->hash())) {
      return failed_precondition(options_.name + " tier: block " + block->hash().hex() +
                                 " was erased while it was being moved here");
    }
    if (Status quota = namespaces_.charge(block->identity().namespace_id, bytes); !quota.ok()) {
      metrics_.rejected_quota.inc();
      return quota;
    }
    // Evict the policy's victims until the new one fits; give up (changing nothing) when pinned
    // blocks leave no room.
    if (used_ + bytes - unpinned_bytes_ > options_.capacity_bytes) {
      release_locked(*block, bytes);
      metrics_.rejected_no_room.inc();
      return resource_exhausted(options_.name + " tier: no room for a " +
                                format_byte_size(bytes) + " block: " +
                                format_byte_size(used_) + " held, the rest pinned");
    }
    while (used_ + bytes > options_.capacity_bytes) {
      const std::optional<BlockHash> v = policy_->victim();
      assert(v && "unpinned bytes suffice, so the policy has a victim");
      evict_locked(*v, victims);
    }
    if (const uint64_t changes = policy_->active_changes(); changes != policy_changes_logged_) {
      policy_changes_logged_ = changes;
      policy_change_log_.info(
          "{} tier: eviction now follows {} (change {}): its simulation at this tier's size hit "
          "more over the last tier-fulls",
          options_.name, policy_->active(), changes);
    }
    const BlockHash hash = block->hash();
    if (is_state_record(*block)) policy_->inserted_snapshot(hash, block->identity().parent_hash, bytes);
    else policy_->inserted(hash, block->identity().parent_hash, bytes);
    const auto placed = index_.emplace(hash, Entry{std::move(block), bytes, 0}).first;
    announce_stored(placed->second.block->identity());
    used_ += bytes;
    unpinned_bytes_ += bytes;
    demote_orphans_locked(victims);
    metrics_.used_bytes.set(static_cast<int64_t>(used_));
    metrics_.blocks.set(static_cast<int64_t>(index_.size()));
  }
  metrics_.inserts.inc();
  sink_victims(victims);
  return InsertOutcome::kInserted;
}

void RamTier::sink_victims(std::vector<BlockRef>& victims) {
  if (victims.empty()) return;
  std::vector<std::pair<BlockHash, const Block*>> sunk;
  for (const BlockRef& b : victims) sunk.emplace_back(b->hash(), b.get());
  evict_to_sink(victims);
  std::lock_guard lock(mu_);
  for (const auto& [hash, block] : sunk) {
    // Only this eviction's entry: the same hash may have been inserted and evicted again since.
    if (auto it = leaving_.find(hash); it != leaving_.end() && it->second.get() == block) leaving_.erase(it);
  }
}

const BlockRef* RamTier::leaving_locked(const BlockHash& hash) const {
  auto it = leaving_.find(hash);
  return it == leaving_.end() ? nullptr : &it->second;
}

void RamTier::evict_locked(const BlockHash& hash, std::vector<BlockRef>& victims) {
  auto it = index_.find(hash);
  policy_->removed(hash);
  used_ -= it->second.bytes;
  unpinned_bytes_ -= it->second.bytes;
  release_locked(*it->second.block, it->second.bytes);
  leaving_[hash] = it->second.block;
  victims.push_back(std::move(it->second.block));
  index_.erase(it);
  announce_removed(hash);
  metrics_.evictions.inc();
}

void RamTier::demote_orphans_locked(std::vector<BlockRef>& victims) {
  while (const std::optional<BlockHash> o = policy_->orphan()) {
    evict_locked(*o, victims);
    metrics_.orphans_demoted.inc();
  }
  metrics_.used_bytes.set(static_cast<int64_t>(used_));
  metrics_.blocks.set(static_cast<int64_t>(index_.size()));
}

bool RamTier::contains(const BlockHash& hash) const {
  std::lock_guard lock(mu_);
  return index_.count(hash) > 0 || leaving_.count(hash) > 0;
}

std::vector<bool> RamTier::contains_many(std::span<const BlockHash> hashes) const {
  std::vector<bool> out(hashes.size());
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < hashes.size(); ++i) out[i] = index_.count(hashes[i]) > 0 || leaving_.count(hashes[i]) > 0;
  return out;
}

Tier::Presence RamTier::probe(const BlockRequest& request) const {
  std::lock_guard lock(mu_);
  auto it = index_.find(request.hash);
  const BlockRef* leaving = it == index_.end() ? leaving_locked(request.hash) : nullptr;
  if (it == index_.end() && !leaving) return Presence::kAbsent;
  const auto& held = (leaving ? *leaving : it->second.block)->identity().token_ids;
  return std::equal(held.begin(), held.end(), request.tokens.begin(), request.tokens.end())
             ? Presence::kSameTokens
             : Presence::kDifferentTokens;
}

Result<BlockRef> RamTier::read(const BlockRequest& request) {
  std::lock_guard lock(mu_);
  auto it = index_.find(request.hash);
  if (it == index_.end()) {
    if (const BlockRef* leaving = leaving_locked(request.hash)) {
      metrics_.hits.inc();
      return *leaving;
    }
    metrics_.misses.inc();
    return not_found(options_.name + " tier: block " + request.hash.hex() + " not held");
  }
  policy_->accessed(request.hash);
  metrics_.hits.inc();
  return it->second.block;
}

bool RamTier::erase(const BlockHash& hash) {
  BlockRef dropped;  // released after the lock
  std::vector<BlockRef> orphans;
  const EraseFence::Move eviction = begin_eviction();  // orphans it demotes are carried down
  {
    std::lock_guard lock(mu_);
    const bool was_leaving = leaving_.erase(hash) > 0;
    if (!erase_locked(hash, dropped)) return was_leaving;
    demote_orphans_locked(orphans);
  }
  sink_victims(orphans);
  return true;
}

bool RamTier::erase_locked(const BlockHash& hash, BlockRef& dropped) {
  auto it = index_.find(hash);
  if (it == index_.end()) return false;
  policy_->removed(hash);
  if (it->second.pins == 0) unpinned_bytes_ -= it->second.bytes;
  else metrics_.pinned_blocks.add(-1);
  used_ -= it->second.bytes;
  release_locked(*it->second.block, it->second.bytes);
  dropped = std::move(it->second.block);
  index_.erase(it);
  announce_removed(hash);
  metrics_.used_bytes.set(static_cast<int64_t>(used_));
  metrics_.blocks.set(static_cast<int64_t>(index_.size()));
  return true;
}

void RamTier::pin_locked(const BlockHash& hash, Entry& e) {
  if (e.pins++ == 0) {
    policy_->pinned(hash);
    unpinned_bytes_ -= e.bytes;
    metrics_.pinned_blocks.add(1);
  }
}

bool RamTier::pin(const BlockHash& hash) {
  std::lock_guard lock(mu_);
  auto it = index_.find(hash);
  if (it == index_.end()) return false;
  pin_locked(hash, it->second);
  return true;
}

std::vector<Tier::PinResult> RamTier::pin_many(std::span<const BlockRequest> requests) {
  std::vector<PinResult> out(requests.size());
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < requests.size(); ++i) {
    auto it = index_.find(requests[i].hash);
    if (it == index_.end()) continue;  // leaving or gone: the caller reads or relocates it
    pin_locked(requests[i].hash, it->second);
    policy_->accessed(requests[i].hash);  // and read, as read() counts it
    metrics_.hits.inc();
    out[i].pinned = true;
    out[i].block = it->second.block;
  }
  return out;
}

void RamTier::unpin(const BlockHash& hash) {
  std::lock_guard lock(mu_);
  auto it = index_.find(hash);
  if (it == index_.end() || it->second.pins == 0) return;
  if (--it->second.pins == 0) {
    policy_->unpinned(hash);
    unpinned_bytes_ += it->second.bytes;
    metrics_.pinned_blocks.add(-1);
  }
}

uint64_t RamTier::used_bytes() const {
  std::lock_guard lock(mu_);
  return used_;
}

size_t RamTier::block_count() const {
  std::lock_guard lock(mu_);
  return index_.size();
}

size_t RamTier::unpinned_count() const {
  std::lock_guard lock(mu_);
  size_t n = 0;
  for (const auto& [h, e] : index_) n += e.pins == 0;
  return n;
}

std::vector<BlockRef> RamTier::blocks() const {
  std::lock_guard lock(mu_);
  std::vector<BlockRef> out;
  out.reserve(index_.size());
  for (const auto& [h, e] : index_) out.push_back(e.block);
  return out;
}

void RamTier::visit_metrics(MetricVisitor& v) const {
  const MetricLabels t{{"tier", options_.name}};
  v.counter("kvtier_tier_inserts_total", "Blocks stored in the tier", t, metrics_.inserts.value());
  v.counter("kvtier_tier_duplicate_inserts_total", "Inserts of a block the tier already held", t,
            metrics_.duplicate_inserts.value());
  v.counter("kvtier_tier_rejected_total", "Inserts refused", {{"tier", options_.name}, {"reason", "no_room"}},
            metrics_.rejected_no_room.value());
  v.counter("kvtier_tier_rejected_total", "Inserts refused", {{"tier", options_.name}, {"reason", "quota"}},
            metrics_.rejected_quota.value());
  namespaces_.visit_metrics(v);
  v.counter("kvtier_tier_evictions_total", "Blocks evicted to the tier below", t,
            metrics_.evictions.value());
  v.counter("kvtier_tier_read_hits_total", "Reads that found the block", t, metrics_.hits.value());
  v.counter("kvtier_tier_read_misses_total", "Reads that did not", t, metrics_.misses.value());
  v.counter("kvtier_ram_quantized_inserts_total", "Blocks quantized on insert", t,
            metrics_.quantized_inserts.value());
  v.counter("kvtier_ram_quantize_skipped_total", "Blocks kept dense (non-finite values)", t,
            metrics_.quantize_skipped.value());
  v.counter("kvtier_ram_orphans_demoted_total", "Blocks handed down because their parent had left (chain-aware policies)",
            t, metrics_.orphans_demoted.value());
  v.gauge("kvtier_ram_eviction_active",
          "The eviction policy choosing victims (adaptive: the one it follows)",
          {{"tier", options_.name},
           {"rule", std::string(eviction_policy())},
           {"policy", eviction_policy_active()}},
          1);
  v.counter("kvtier_ram_eviction_changes_total",
            "Times adaptive eviction changed the policy it follows", t, eviction_policy_changes());
  v.gauge("kvtier_tier_used_bytes", "Bytes held", t, static_cast<double>(metrics_.used_bytes.value()));
  v.gauge("kvtier_tier_capacity_bytes", "Capacity", t, static_cast<double>(options_.capacity_bytes));
  v.gauge("kvtier_tier_blocks", "Blocks held", t, static_cast<double>(metrics_.blocks.value()));
  v.gauge("kvtier_tier_pinned_blocks", "Blocks pinned", t,
          static_cast<double>(metrics_.pinned_blocks.value()));
}

}  // namespace kvtier
