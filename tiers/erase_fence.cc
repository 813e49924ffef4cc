#include "tiers/erase_fence.h"

namespace kvtier {

EraseFence::Move& EraseFence::Move::operator=(Move&& o) noexcept {
  if (this != &o) {
    end();
    fence_ = o.fence_;
    ticket_ = o.ticket_;
    o.fence_ = nullptr;
  }
  return *this;
}

void EraseFence::Move::end() {
  if (fence_) fence_->end_move(ticket_);
  fence_ = nullptr;
}

EraseFence::Erasure::~Erasure() { fence_->end_erase(hash_); }

EraseFence::Move EraseFence::begin_move() {
  std::lock_guard lock(mu_);
  const uint64_t ticket = ++epoch_;
  in_flight_.insert(ticket);
  return Move(this, ticket);
}

void EraseFence::end_move(uint64_t ticket) {
  std::lock_guard lock(mu_);
  in_flight_.erase(ticket);
  prune_locked();
}

EraseFence::Erasure EraseFence::begin_erase(const BlockHash& hash) {
  std::lock_guard lock(mu_);
  auto [it, added] = tombs_.try_emplace(hash);
  ++it->second.erasing;
  if (added) count_.fetch_add(1, std::memory_order_acq_rel);
  return Erasure(this, hash);
}

void EraseFence::end_erase(const BlockHash& hash) {
  std::lock_guard lock(mu_);
  auto it = tombs_.find(hash);
  if (it == tombs_.end()) return;  // revived meanwhile
  if (--it->second.erasing > 0) return;
  // Moves that began before this point may still carry the block; later ones cannot find it.
  it->second.settled = ++epoch_;
  aging_.emplace_back(it->second.settled, hash);
  prune_locked();
}

void EraseFence::revive(const BlockHash& hash) {
  if (count_.load(std::memory_order_acquire) == 0) return;
  std::lock_guard lock(mu_);
  if (tombs_.erase(hash)) count_.fetch_sub(1, std::memory_order_acq_rel);
}

bool EraseFence::blocks(const BlockHash& hash) const {
  if (count_.load(std::memory_order_acquire) == 0) return false;
  std::lock_guard lock(mu_);
  return tombs_.count(hash) > 0;
}

size_t EraseFence::moves_in_flight() const {
  std::lock_guard lock(mu_);
  return in_flight_.size();
}

void EraseFence::prune_locked() {
  const uint64_t oldest = in_flight_.empty() ? UINT64_MAX : *in_flight_.begin();
  while (!aging_.empty() && aging_.front().first < oldest) {
    auto it = tombs_.find(aging_.front().second);
    // Only the tombstone this entry aged: the hash may have been revived and erased again since.
    if (it != tombs_.end() && it->second.erasing == 0 && it->second.settled == aging_.front().first) {
      tombs_.erase(it);
      count_.fetch_sub(1, std::memory_order_acq_rel);
    }
    aging_.pop_front();
  }
}

}  // namespace kvtier
