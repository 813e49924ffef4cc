#include "tiers/ssd/write/segment_allocator.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <unordered_map>

#include "base/byte_size.h"
#include "serialize/format/checksum.h"
#include "serialize/format/frame.h"

namespace kvtier {

namespace {
uint64_t now_unix() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::seconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}
}  // namespace

SegmentAllocator::SegmentAllocator(SsdState& state, Hooks hooks) : state_(state), hooks_(std::move(hooks)) {}

uint64_t SegmentAllocator::max_segments() const {
  return std::max<uint64_t>(2, state_.options.capacity_bytes / state_.options.segment_size);
}

Status SegmentAllocator::start(IoUringRing& ring) {
  ring_ = &ring;
  // Reclaim needs one segment that is not active.
  const uint64_t lanes = std::clamp<uint64_t>(state_.options.active_segments, 1, max_segments() - 1);
  lanes_.assign(lanes, Lane{});
  // Down to the capacity (it may have been lowered since the last run), not below it: room for
  // the next segment is made when one is needed. Making it here reclaimed the oldest segment of
  // a full tier at every start, blocks the last shutdown had reported written.
  return enforce_capacity(/*room=*/0);
}

bool SegmentAllocator::fits(uint64_t size) const {
  const Lane& lane = lanes_[lane_];
  return lane.segment && lane.cursor + size <= state_.options.segment_size;
}

Result<SegmentAllocator::Place> SegmentAllocator::place(uint64_t size) {
  if (size > state_.options.segment_size) {
    return invalid_argument("record of " + format_byte_size(size) + " exceeds the segment size");
  }
  if (!fits(size)) KVTIER_RETURN_IF_ERROR(rotate());
  Lane& lane = lanes_[lane_];
  const Place p{*lane.segment, lane.cursor};
  lane.cursor += size;
  return p;
}

bool SegmentAllocator::seal(uint64_t segment) {
  auto lane = std::find_if(lanes_.begin(), lanes_.end(), [&](const Lane& l) { return l.segment == segment; });
  if (lane == lanes_.end()) return false;
  *lane = Lane{};
  return true;
}

std::vector<uint64_t> SegmentAllocator::active_ids() const {
  std::vector<uint64_t> ids;
  for (const Lane& l : lanes_) {
    if (l.segment) ids.push_back(*l.segment);
  }
  return ids;
}

Status SegmentAllocator::rotate() {
  lanes_[lane_] = Lane{};
  if (state_.segments.count() + 1 > max_segments()) {
    hooks_.drain();  // reclaim must not race writes into the segment it removes
    KVTIER_RETURN_IF_ERROR(enforce_capacity(/*room=*/1));
  }
  return open_segment();
}

Status SegmentAllocator::open_segment() {
  const uint64_t id = state_.segments.max_id() + 1;
  KVTIER_ASSIGN_OR_RETURN(auto file, SegmentFile::create(state_.segment_path(id), id,
                                                         state_.options.segment_size,
                                                         state_.options.direct_io));
  SegmentRecord rec;
  rec.id = id;
  rec.created_unix = now_unix();
  {
    std::lock_guard lock(state_.index_mu);
    SsdIndex::Batch b;
    b.put_segment(rec);
    Status st = state_.index->commit(b);
    if (!st.ok()) {
      ::unlink(file->path().c_str());
      return st;
    }
    state_.segments.add(rec, file);
  }
  lanes_[lane_] = Lane{id, std::move(file), 0};
  state_.metrics.segments_created.inc();
  state_.refresh_space_gauges();
  return ok_status();
}

Status SegmentAllocator::enforce_capacity(uint64_t room) {
  while (state_.segments.count() + room > max_segments()) {
    auto victim = state_.segments.oldest(active_ids());
    if (!victim) break;
    KVTIER_RETURN_IF_ERROR(reclaim(*victim));
  }
  return ok_status();
}

size_t SegmentAllocator::move_read_blocks(uint64_t segment, const std::shared_ptr<SegmentFile>& file,
                                          std::span<const std::pair<uint64_t, BlockHash>> records) {
  // At most half a segment moves, so every reclaim frees room. Moving a whole segment's worth
  // would take back the room it freed: on a disk whose blocks were all read, each reclaim then
  // called the next until the cascade had gone round the disk and reached the newest writes (never
  // read, so not moved), which went instead of the old ones it had just rewritten.
  const uint64_t budget = state_.options.segment_size / 2;
  uint64_t moved_bytes = 0;
  size_t moved = 0, skipped = 0;
  for (const auto& [off, h] : records) {
    if (!state_.reads.take(h)) continue;
    auto e = state_.index->get(h);
    if (!e.ok() || !e->has_value() || (*e)->segment != segment || (*e)->offset != off) continue;
    const IndexEntry& entry = **e;
    if (moved_bytes + record_padded(entry.length) > budget) {
      state_.metrics.reinsert_skipped.inc();  // goes with its segment, as a block never read
      ++skipped;
      continue;
    }
    moved_bytes += record_padded(entry.length);
    auto item = std::make_shared<SpillItem>();
    item->hash = h;
    item->buffer = AlignedBuffer(record_padded(entry.length), kRecordAlign, /*zeroed=*/false);
    item->layout_fingerprint = entry.layout_fingerprint;
    item->token_count = entry.token_count;
    item->namespace_id = entry.namespace_id;
    item->preframed = true;
    IoOp op = IoOp::read(file->fd(), item->buffer.data(), item->buffer.size(), entry.offset);
    Status st = run_io_batch(*ring_, std::span<IoOp>(&op, 1));
    auto header = parse_frame_header(item->buffer.span());
    if (!st.ok() || op.error || op.done < entry.length || !header.ok() ||
        header->payload_checksum != entry.checksum ||
        checksum64(item->buffer.data() + kFrameHeaderSize, header->stored_length) != entry.checksum) {
      state_.metrics.reinsert_failed.inc();
      state_.write_fail_log.warn(
          "ssd tier: block {} read since it was written not moved out of reclaimed segment {}: "
          "its record could not be read back intact",
          h.hex(), segment);
      continue;  // a damaged record is simply not moved
    }
    hooks_.reinsert(std::move(item));
    ++moved;
  }
  if (skipped > 0) {
    spdlog::debug(
        "ssd tier: segment {}: {} read blocks past the half segment a reclaim moves go with it",
        segment, skipped);
  }
  return moved;
}

Status SegmentAllocator::reclaim(uint64_t segment) {
  std::vector<std::pair<uint64_t, BlockHash>> records;
  KVTIER_RETURN_IF_ERROR(state_.index->scan_segment(
      segment, [&](uint64_t off, const BlockHash& h) { records.emplace_back(off, h); }));
  auto file = state_.segments.file(segment);
  // Blocks read since they were written get a second life in the current segment. Nothing is in
  // flight here (the caller drained), so the ring can be used synchronously.
  const size_t moved =
      state_.options.reinsert_read_blocks && file ? move_read_blocks(segment, file, records) : 0;

  std::vector<BlockHash> removed;
  std::vector<std::pair<std::string, uint64_t>> freed;  // namespace, record bytes
  {
    std::lock_guard lock(state_.index_mu);
    SsdIndex::Batch batch;
    for (const auto& [off, h] : records) {
      auto e = state_.index->get(h);
      if (e.ok() && e->has_value() && (*e)->segment == segment && (*e)->offset == off) {
        batch.remove(h, **e);
        freed.emplace_back((*e)->namespace_id, record_padded((*e)->length));
        removed.push_back(h);
      } else {
        batch.remove_segment_key(segment, off);  // superseded or undecodable: the key alone
      }
    }
    batch.remove_segment(segment);
    // Synced: the segment file is unlinked right after, and a power loss must not bring back
    // entries that point into it.
    KVTIER_RETURN_IF_ERROR(state_.index->commit(batch, /*sync=*/true));
    state_.segments.remove(segment);
    for (const BlockHash& h : removed) state_.outcomes.left(h);
    if (state_.events) {
      for (const BlockHash& h : removed) state_.events->removed(h);
    }
  }
  hooks_.reclaimed(segment);
  for (const auto& [ns, bytes] : freed) state_.namespaces->add(ns, -static_cast<int64_t>(bytes));
  if (file && ::unlink(file->path().c_str()) != 0) {
    spdlog::warn("ssd tier: unlink {}: {}", file->path(), std::strerror(errno));
  }
  state_.metrics.segments_reclaimed.inc();
  state_.metrics.entries_reclaimed.inc(removed.size());
  state_.refresh_space_gauges();
  spdlog::debug("ssd tier: reclaimed segment {} ({} entries, {} to reinsert)", segment,
                removed.size(), moved);
  return ok_status();
}

}  // namespace kvtier
