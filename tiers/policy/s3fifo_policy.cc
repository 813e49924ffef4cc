#include "tiers/policy/s3fifo_policy.h"

namespace kvtier {

void S3FifoPolicy::enqueue(const BlockHash& hash, Entry& e, Queue q) {
  if (e.queue == Queue::kSmall && q != Queue::kSmall) small_bytes_ -= e.bytes;
  if (e.queue != Queue::kSmall && q == Queue::kSmall) small_bytes_ += e.bytes;
  e.queue = q;
  e.pos = queue(q).insert(queue(q).end(), hash);
}

void S3FifoPolicy::dequeue(Entry& e) { queue(e.queue).erase(e.pos); }

void S3FifoPolicy::remember_ghost(const BlockHash& hash) {
  if (!ghost_.insert(hash).second) return;
  ghost_order_.push_back(hash);
  // The ghost remembers about as many blocks as main holds.
  while (ghost_order_.size() > std::max<size_t>(main_.size(), 16)) {
    ghost_.erase(ghost_order_.front());
    ghost_order_.pop_front();
  }
}

void S3FifoPolicy::refile_orphan(const BlockHash& hash) {
  auto it = entries_.find(hash);
  if (!chain_aware_ || it == entries_.end()) return;
  Entry& e = it->second;
  const bool want = !e.pinned && chains_.is_orphan(hash);
  if (want == e.in_orphans) return;
  if (want) orphans_.insert({e.tick, hash});
  else orphans_.erase({e.tick, hash});
  e.in_orphans = want;
}

void S3FifoPolicy::inserted(const BlockHash& hash, const BlockHash& parent, uint64_t bytes) {
  Entry& e = entries_[hash];
  e.bytes = bytes;
  e.tick = ++clock_;
  total_bytes_ += bytes;
  const bool returning = ghost_.erase(hash) > 0;
  e.queue = Queue::kMain;  // so enqueue() counts small bytes from here
  enqueue(hash, e, returning ? Queue::kMain : Queue::kSmall);
  chains_.add(hash, parent);
  refile_orphan(hash);
}

void S3FifoPolicy::accessed(const BlockHash& hash) {
  auto it = entries_.find(hash);
  if (it != entries_.end() && it->second.freq < 3) ++it->second.freq;
}

void S3FifoPolicy::pinned(const BlockHash& hash) {
  auto it = entries_.find(hash);
  if (it == entries_.end() || it->second.pinned) return;
  dequeue(it->second);
  it->second.pinned = true;
  refile_orphan(hash);
}

void S3FifoPolicy::unpinned(const BlockHash& hash) {
  auto it = entries_.find(hash);
  if (it == entries_.end() || !it->second.pinned) return;
  it->second.pinned = false;
  it->second.pos = queue(it->second.queue).insert(queue(it->second.queue).end(), hash);
  if (it->second.freq < 3) ++it->second.freq;  // it was in use
  refile_orphan(hash);
}

void S3FifoPolicy::removed(const BlockHash& hash) {
  auto it = entries_.find(hash);
  if (it == entries_.end()) return;
  Entry& e = it->second;
  if (!e.pinned) dequeue(e);
  if (e.in_orphans) orphans_.erase({e.tick, hash});
  if (e.queue == Queue::kSmall) small_bytes_ -= e.bytes;
  total_bytes_ -= e.bytes;
  entries_.erase(it);
  chains_.remove(hash);
  if (evicting_from_small_ == hash) remember_ghost(hash);
  evicting_from_small_.reset();
}

std::optional<BlockHash> S3FifoPolicy::victim() {
  evicting_from_small_.reset();
  if (!orphans_.empty()) return orphans_.begin()->second;
  // Each pass may move a block along; bounded so that a tier full of pinned or inner blocks
  // still gets an answer.
  for (size_t pass = 0, limit = 4 * entries_.size() + 4; pass < limit; ++pass) {
    const bool from_small = !small_.empty() && (main_.empty() || small_bytes_ * 10 > total_bytes_);
    std::list<BlockHash>& q = from_small ? small_ : main_;
    if (q.empty()) return std::nullopt;
    const BlockHash h = q.front();
    Entry& e = entries_.at(h);
    const bool last_chance = pass + 1 >= limit;
    // In main, a chain-aware policy passes over blocks that resident blocks extend, so a prefix
    // loses its tail before its head (a prompt longer than main keeps its beginning). Not in
    // small: there the order is the probation's, and a scan's head leaving first orphans the
    // rest of it, which then goes at once.
    const bool extended = chain_aware_ && !from_small && !chains_.is_leaf(h) && pass < entries_.size();
    if (!last_chance && extended && e.freq == 0) {
      dequeue(e);
      enqueue(h, e, Queue::kMain);
      continue;
    }
    if (!last_chance && e.freq > 0) {
      dequeue(e);
      if (from_small) {
        e.freq = 0;
        enqueue(h, e, Queue::kMain);  // read while probationary: promoted
      } else {
        --e.freq;
        enqueue(h, e, Queue::kMain);  // another pass through main
      }
      continue;
    }
    if (from_small) evicting_from_small_ = h;
    return h;
  }
  return std::nullopt;
}

std::optional<BlockHash> S3FifoPolicy::orphan() {
  if (orphans_.empty()) return std::nullopt;
  return orphans_.begin()->second;
}

}  // namespace kvtier
