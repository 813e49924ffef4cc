#include "cache/events/kv_event_queue.h"

namespace kvtier {
namespace {

class MediumSink final : public BlockEventSink {
 public:
  MediumSink(std::shared_ptr<KvEventQueue> queue, KvMedium medium, bool wait_for_room)
      : queue_(std::move(queue)), medium_(medium), wait_(wait_for_room) {}

  void stored(const StoredBlock& b) override {
    KvEvent e;
    e.kind = KvEvent::Kind::kStored;
    e.medium = medium_;
    e.hash = b.hash;
    if (b.parent) {
      e.has_parent = true;
      e.parent = *b.parent;
    }
    e.block_tokens = b.block_tokens;
    queue_->push(e, b.token_ids, b.namespace_id, wait_);
  }
  void removed(const BlockHash& hash) override {
    KvEvent e;
    e.kind = KvEvent::Kind::kRemoved;
    e.medium = medium_;
    e.hash = hash;
    queue_->push(e, {}, {}, wait_);
  }

 private:
  std::shared_ptr<KvEventQueue> queue_;
  KvMedium medium_;
  bool wait_;
};

}  // namespace

void KvEventQueue::push(const KvEvent& event, std::span<const uint32_t> tokens, std::string_view ns,
                        bool wait_for_room) {
  const auto m = static_cast<size_t>(event.medium);
  const auto k = static_cast<size_t>(event.kind);
  std::unique_lock lock(mu_);
  if (wait_for_room) room_cv_.wait(lock, [&] { return closed_ || events_.size() < capacity_; });
  if (closed_) {
    dropped_closed_.inc();
    lock.unlock();
    closed_log_.warn("kv events: a {} event told after the publisher closed is not sent",
                     medium_name(event.medium));
  } else if (events_.size() >= capacity_) {
    dropped_full_.inc();
  } else {
    events_.append(event, tokens, ns);
    ++accepted_;
    accepted_by_[m][k].inc();
  }
}

void KvEventQueue::take(KvEventBuffer& out, uint64_t& through) {
  out.clear();
  {
    std::lock_guard lock(mu_);
    out.swap(events_);
    through = accepted_;
  }
  room_cv_.notify_all();
}

void KvEventQueue::handled(uint64_t through) {
  {
    std::lock_guard lock(mu_);
    handled_ = std::max(handled_, through);
  }
  handled_cv_.notify_all();
}

bool KvEventQueue::wait_handled(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  const uint64_t target = accepted_;
  return handled_cv_.wait_for(lock, timeout, [&] { return handled_ >= target; });
}

void KvEventQueue::close() {
  {
    std::lock_guard lock(mu_);
    closed_ = true;
  }
  room_cv_.notify_all();
}

size_t KvEventQueue::depth() const {
  std::lock_guard lock(mu_);
  return events_.size();
}

std::shared_ptr<BlockEventSink> KvEventQueue::sink(KvMedium medium, bool wait_for_room) {
  return std::make_shared<MediumSink>(shared_from_this(), medium, wait_for_room);
}

}  // namespace kvtier
