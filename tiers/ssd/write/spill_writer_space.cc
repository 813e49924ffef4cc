// SpillWriter's space management: where each record goes (segment placement and rotation),
// opening new segments, and reclaiming the oldest segment when the tier is over capacity. Split
// from spill_writer.cc, which keeps the loop, the io_uring traffic and the commits.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <unordered_map>

#include "base/byte_size.h"
#include "serialize/format/checksum.h"
#include "tiers/ssd/write/spill_writer.h"

namespace kvtier {

namespace {
uint64_t padded(uint64_t n) { return (n + kRecordAlign - 1) / kRecordAlign * kRecordAlign; }
uint64_t now_unix() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::seconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}
}  // namespace

Status SpillWriter::place(Record& r, uint64_t size) {
  if (size > state_.options.segment_size) {
    return invalid_argument("record of " + format_byte_size(size) + " exceeds the segment size");
  }
  Lane& lane = lanes_[lane_];
  if (!lane.segment || lane.cursor + size > state_.options.segment_size) {
    KVTIER_RETURN_IF_ERROR(rotate_segment());
  }
  r.segment = *lane.segment;
  r.offset = lane.cursor;
  lane.cursor += size;
  return ok_status();
}

std::vector<uint64_t> SpillWriter::active_ids() const {
  std::vector<uint64_t> ids;
  for (const Lane& l : lanes_) {
    if (l.segment) ids.push_back(*l.segment);
  }
  return ids;
}

Status SpillWriter::rotate_segment() {
  lanes_[lane_] = Lane{};
  if (state_.segments.count() + 1 > max_segments()) {
    drain();  // reclaim must not race writes into the segment it removes
    KVTIER_RETURN_IF_ERROR(enforce_capacity());
  }
  return open_segment();
}

Status SpillWriter::open_segment() {
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

Status SpillWriter::enforce_capacity() {
  // Room for one more segment (the one about to be opened).
  while (state_.segments.count() + 1 > max_segments()) {
    auto victim = state_.segments.oldest(active_ids());
    if (!victim) break;
    KVTIER_RETURN_IF_ERROR(reclaim(*victim));
  }
  return ok_status();
}

Status SpillWriter::reclaim(uint64_t segment) {
  std::vector<std::pair<uint64_t, BlockHash>> records;
  KVTIER_RETURN_IF_ERROR(state_.index->scan_segment(
      segment, [&](uint64_t off, const BlockHash& h) { records.emplace_back(off, h); }));
  auto file = state_.segments.file(segment);

  // Blocks read since they were written get a second life in the current segment. Nothing is in
  // flight here (the caller drained), so the ring can be used synchronously.
  if (state_.options.reinsert_read_blocks && file) {
    for (const auto& [off, h] : records) {
      if (!state_.reads.take(h)) continue;
      auto e = state_.index->get(h);
      if (!e.ok() || !e->has_value() || (*e)->segment != segment || (*e)->offset != off) continue;
      const IndexEntry& entry = **e;
      auto item = std::make_shared<SpillItem>();
      item->hash = h;
      item->buffer = AlignedBuffer(padded(entry.length), kRecordAlign, /*zeroed=*/false);
      item->layout_fingerprint = entry.layout_fingerprint;
      item->token_count = entry.token_count;
      item->namespace_id = entry.namespace_id;
      item->preframed = true;
      IoOp op{IoOp::Kind::kRead, file->fd(), item->buffer.data(), item->buffer.size(), entry.offset};
      Status st = run_io_batch(*ring_, std::span<IoOp>(&op, 1));
      auto header = parse_frame_header(item->buffer.span());
      if (!st.ok() || op.error || op.done < entry.length || !header.ok() ||
          header->payload_checksum != entry.checksum ||
          checksum64(item->buffer.data() + kFrameHeaderSize, header->stored_length) != entry.checksum) {
        state_.metrics.reinsert_failed.inc();
        continue;  // a damaged record is simply not moved
      }
      reinserts_.push_back(std::move(item));
      std::lock_guard lock(done_mu_);
      ++reinserts_outstanding_;
    }
  }

  size_t removed = 0;
  std::vector<std::pair<std::string, uint64_t>> freed;  // namespace, record bytes
  {
    std::lock_guard lock(state_.index_mu);
    SsdIndex::Batch batch;
    for (const auto& [off, h] : records) {
      auto e = state_.index->get(h);
      if (e.ok() && e->has_value() && (*e)->segment == segment && (*e)->offset == off) {
        batch.remove(h, **e);
        freed.emplace_back((*e)->namespace_id, padded((*e)->length));
        ++removed;
      } else {
        batch.remove_segment_key(segment, off);  // superseded or undecodable: the key alone
      }
    }
    batch.remove_segment(segment);
    // Synced: the segment file is unlinked right after, and a power loss must not bring back
    // entries that point into it.
    KVTIER_RETURN_IF_ERROR(state_.index->commit(batch, /*sync=*/true));
    state_.segments.remove(segment);
  }
  failed_sync_.erase(segment);
  for (const auto& [ns, bytes] : freed) state_.namespaces->add(ns, -static_cast<int64_t>(bytes));
  if (file && ::unlink(file->path().c_str()) != 0) {
    spdlog::warn("ssd tier: unlink {}: {}", file->path(), std::strerror(errno));
  }
  state_.metrics.segments_reclaimed.inc();
  state_.metrics.entries_reclaimed.inc(removed);
  state_.refresh_space_gauges();
  spdlog::debug("ssd tier: reclaimed segment {} ({} entries, {} to reinsert)", segment, removed,
                reinserts_.size());
  return ok_status();
}

}  // namespace kvtier
