#include "tiers/ssd/index/segment_table.h"

#include <algorithm>

namespace kvtier {

void SegmentTable::add(const SegmentRecord& record, std::shared_ptr<SegmentFile> file) {
  std::lock_guard lock(mu_);
  slots_[record.id] = Slot{record, std::move(file)};
}

void SegmentTable::remove(uint64_t id) {
  std::shared_ptr<SegmentFile> last;  // the file closes outside the lock
  std::lock_guard lock(mu_);
  auto it = slots_.find(id);
  if (it == slots_.end()) return;
  last = std::move(it->second.file);
  slots_.erase(it);
}

std::shared_ptr<SegmentFile> SegmentTable::file(uint64_t id) const {
  std::lock_guard lock(mu_);
  auto it = slots_.find(id);
  return it == slots_.end() ? nullptr : it->second.file;
}

std::optional<SegmentRecord> SegmentTable::record(uint64_t id) const {
  std::lock_guard lock(mu_);
  auto it = slots_.find(id);
  if (it == slots_.end()) return std::nullopt;
  return it->second.record;
}

std::optional<SegmentRecord> SegmentTable::add_live(uint64_t id, int64_t bytes, int64_t entries) {
  std::lock_guard lock(mu_);
  auto it = slots_.find(id);
  if (it == slots_.end()) return std::nullopt;
  SegmentRecord& r = it->second.record;
  r.live_bytes = static_cast<uint64_t>(static_cast<int64_t>(r.live_bytes) + bytes);
  r.live_entries = static_cast<uint64_t>(static_cast<int64_t>(r.live_entries) + entries);
  return r;
}

std::optional<SegmentRecord> SegmentTable::set_watermark(uint64_t id, uint64_t watermark) {
  std::lock_guard lock(mu_);
  auto it = slots_.find(id);
  if (it == slots_.end()) return std::nullopt;
  it->second.record.watermark = watermark;
  return it->second.record;
}

std::optional<uint64_t> SegmentTable::oldest(std::span<const uint64_t> except) const {
  std::lock_guard lock(mu_);
  for (const auto& [id, slot] : slots_) {
    if (std::find(except.begin(), except.end(), id) == except.end()) return id;
  }
  return std::nullopt;
}

std::vector<SegmentRecord> SegmentTable::records() const {
  std::lock_guard lock(mu_);
  std::vector<SegmentRecord> out;
  for (const auto& [id, slot] : slots_) out.push_back(slot.record);
  return out;
}

size_t SegmentTable::count() const {
  std::lock_guard lock(mu_);
  return slots_.size();
}

uint64_t SegmentTable::live_bytes() const {
  std::lock_guard lock(mu_);
  uint64_t total = 0;
  for (const auto& [id, slot] : slots_) total += slot.record.live_bytes;
  return total;
}

uint64_t SegmentTable::max_id() const {
  std::lock_guard lock(mu_);
  return slots_.empty() ? 0 : slots_.rbegin()->first;
}

}  // namespace kvtier
