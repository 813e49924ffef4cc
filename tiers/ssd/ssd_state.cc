#include "tiers/ssd/ssd_state.h"

namespace kvtier {

void ReadTracker::mark_all(std::span<const BlockHash> hashes) {
  if (hashes.empty()) return;
  std::lock_guard lock(mu_);
  if (read_.size() + hashes.size() > kMaxTracked) read_.clear();
  read_.insert(hashes.begin(), hashes.end());
}

bool ReadTracker::take(const BlockHash& h) {
  std::lock_guard lock(mu_);
  return read_.erase(h) > 0;
}

void WriteOutcomeSample::written(const BlockHash& h, uint64_t bytes) {
  if (!sampled(h)) return;
  std::lock_guard lock(mu_);
  if (tracked_.size() < kMaxTracked) tracked_[h] = Outcome{bytes, false};
}

void WriteOutcomeSample::read(std::span<const BlockHash> hashes) {
  bool any = false;
  for (const BlockHash& h : hashes) any = any || sampled(h);
  if (!any) return;  // most reads: no lock
  std::lock_guard lock(mu_);
  for (const BlockHash& h : hashes) {
    if (!sampled(h)) continue;
    if (auto it = tracked_.find(h); it != tracked_.end()) it->second.read = true;
  }
}

void WriteOutcomeSample::left(const BlockHash& h) {
  if (!sampled(h)) return;
  Outcome o;
  {
    std::lock_guard lock(mu_);
    auto it = tracked_.find(h);
    if (it == tracked_.end()) return;
    o = it->second;
    tracked_.erase(it);
  }
  (o.read ? metrics_.left_read_bytes : metrics_.left_never_read_bytes).inc(o.bytes * kOneIn);
}

std::string SsdState::segment_path(uint64_t id) const {
  return segments_dir() + "/" + SegmentFile::file_name(id);
}

Status SsdState::remove_entry_if(const BlockHash& hash, const IndexEntry& seen) {
  std::lock_guard lock(index_mu);
  return remove_entry_if_locked(hash, seen);
}

Status SsdState::remove_entry_if_locked(const BlockHash& hash, const IndexEntry& seen) {
  auto current = index->get(hash);
  if (!current.ok() || !current->has_value() || !(**current == seen)) return ok_status();
  SsdIndex::Batch batch;
  batch.remove(hash, seen);
  const uint64_t padded = (seen.length + kRecordAlign - 1) / kRecordAlign * kRecordAlign;
  if (auto rec = segments.add_live(seen.segment, -static_cast<int64_t>(padded), -1)) {
    batch.put_segment(*rec);
  }
  Status st = index->commit(batch);
  if (st.ok()) {
    namespaces->add(seen.namespace_id, -static_cast<int64_t>(padded));
    outcomes.left(hash);
    if (events) events->removed(hash);
  }
  refresh_space_gauges();
  return st;
}

Status SsdState::remove_undecodable(const BlockHash& hash) {
  std::lock_guard lock(index_mu);
  return remove_undecodable_locked(hash);
}

Status SsdState::remove_undecodable_locked(const BlockHash& hash) {
  SsdIndex::Batch batch;
  batch.remove_primary(hash);
  return index->commit(batch);
}

void SsdState::refresh_space_gauges() {
  metrics.segments.set(static_cast<int64_t>(segments.count()));
  metrics.used_bytes.set(static_cast<int64_t>(segments.count() * options.segment_size));
  metrics.live_bytes.set(static_cast<int64_t>(segments.live_bytes()));
}

}  // namespace kvtier
