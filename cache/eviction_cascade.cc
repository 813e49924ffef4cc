#include "cache/eviction_cascade.h"

#include "serialize/block_hash_format.h"

namespace kvtier {

void EvictionCascade::set_admission(size_t tier, std::unique_ptr<AdmissionPolicy> policy) {
  admission_tier_ = tier;
  admission_ = std::move(policy);
}

void EvictionCascade::on_evicted(size_t from, BlockRef block) {
  metrics_.evictions[from].inc();
  if (fence_.blocks(block->hash())) {
    // Erased after it left `from`: the end of its life (the tiers below would refuse it too).
    metrics_.dropped_erased_in_flight.inc();
    drop_log_.info("block {} evicted from {} was deleted on its way down: dropped",
                   block->hash(), tiers_[from]->name());
    return;
  }
  // The next local tier down takes it; one that cannot (a block larger than it, everything
  // pinned) passes it further down rather than losing it.
  bool kept = false, lower_local = false;
  Status last;
  for (size_t t = from + 1; t < tiers_.size() && !kept; ++t) {
    if (tiers_[t]->remote() || !tiers_[t]->accepts(block->layout())) continue;
    lower_local = true;
    if (t == admission_tier_ && !admission_->admit(block->hash(), block->size_bytes())) {
      last = failed_precondition("not admitted by " + std::string(admission_->name()));
      continue;
    }
    auto r = tiers_[t]->insert(block);
    kept = r.ok();
    if (!kept) last = r.status();
  }
  // Shared tiers get it write-behind whatever the local ones did (they count their own drops).
  const bool shared = offer_to_shared(block, from + 1);
  if (kept) return;
  if (!shared) tell_dropped(block);
  if (!lower_local) {
    if (!shared) metrics_.dropped_evicted_from_last_tier.inc();  // the normal end of a block's life
    return;
  }
  if (shared) return;
  if (last.code() == StatusCode::kFailedPrecondition && admission_) {
    metrics_.dropped_not_admitted.inc();  // the admission rule's job: counted, logged once a while
    admission_log_.info("block {} evicted from {} not written to {}: {}", block->hash(),
                        tiers_[from]->name(), tiers_[admission_tier_]->name(), last.message());
    return;
  }
  metrics_.dropped_lower_tier_refused.inc();
  drop_log_.warn("dropped block {} evicted from {}: {}", block->hash(), tiers_[from]->name(), last.to_string());
}

bool EvictionCascade::offer_to_shared(const BlockRef& block, size_t first_tier) {
  bool taken = false;
  for (size_t t = first_tier; t < tiers_.size(); ++t) {
    if (tiers_[t]->remote()) taken = tiers_[t]->insert(block).ok() || taken;
  }
  return taken;
}

size_t EvictionCascade::add_drop_listener(DropListener listener) {
  std::lock_guard lock(listeners_mu_);
  listeners_.emplace(next_listener_, std::move(listener));
  return next_listener_++;
}

void EvictionCascade::remove_drop_listener(size_t id) {
  std::lock_guard lock(listeners_mu_);
  listeners_.erase(id);
}

void EvictionCascade::tell_dropped(const BlockRef& block) {
  std::lock_guard lock(listeners_mu_);
  for (const auto& [id, listener] : listeners_) listener(block);
}

}  // namespace kvtier
