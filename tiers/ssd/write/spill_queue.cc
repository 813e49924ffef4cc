#include "tiers/ssd/write/spill_queue.h"

namespace kvtier {

bool SpillQueue::try_push(SpillItemPtr item) {
  {
    std::lock_guard lock(mu_);
    if (closed_ || charged_ + item->charged_bytes > capacity_) return false;
    charged_ += item->charged_bytes;
    items_.push_back(std::move(item));
  }
  cv_.notify_one();
  return true;
}

std::vector<SpillItemPtr> SpillQueue::pop_batch(size_t max_items, uint64_t max_bytes,
                                                std::chrono::milliseconds wait) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, wait, [&] { return !items_.empty() || closed_; });
  std::vector<SpillItemPtr> out;
  uint64_t bytes = 0;
  while (!items_.empty() && out.size() < max_items && (out.empty() || bytes < max_bytes)) {
    bytes += items_.front()->charged_bytes;
    out.push_back(std::move(items_.front()));
    items_.pop_front();
  }
  return out;
}

void SpillQueue::release(uint64_t bytes) {
  std::lock_guard lock(mu_);
  charged_ -= bytes;
}

void SpillQueue::close() {
  {
    std::lock_guard lock(mu_);
    closed_ = true;
  }
  cv_.notify_all();
}

bool SpillQueue::closed() const {
  std::lock_guard lock(mu_);
  return closed_;
}

uint64_t SpillQueue::charged_bytes() const {
  std::lock_guard lock(mu_);
  return charged_;
}

size_t SpillQueue::queued_items() const {
  std::lock_guard lock(mu_);
  return items_.size();
}

}  // namespace kvtier
