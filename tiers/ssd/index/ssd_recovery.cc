#include "tiers/ssd/index/ssd_recovery.h"

#include <unistd.h>

#include <filesystem>
#include <set>

namespace kvtier {

namespace fs = std::filesystem;

Status recover_segments(SsdState& s) {
  std::vector<SegmentRecord> records;
  std::vector<uint64_t> corrupt_ids;
  KVTIER_RETURN_IF_ERROR(s.index->load_segments(records, corrupt_ids));

  // Drops the entries of `segment` whose records end past `keep_below` (all of them for 0).
  auto drop_entries = [&](uint64_t segment, uint64_t keep_below) -> Status {
    std::vector<std::pair<uint64_t, BlockHash>> keys;
    KVTIER_RETURN_IF_ERROR(s.index->scan_segment(
        segment, [&](uint64_t off, const BlockHash& h) { keys.emplace_back(off, h); }));
    SsdIndex::Batch batch;
    for (const auto& [off, h] : keys) {
      auto e = s.index->get(h);
      const bool points_here = e.ok() && e->has_value() && (*e)->segment == segment && (*e)->offset == off;
      if (points_here && off + record_padded((*e)->length) <= keep_below) continue;
      if (points_here) {
        batch.remove(h, **e);
        s.metrics.recovery_dropped_entries.inc();
      } else {
        batch.remove_segment_key(segment, off);
      }
    }
    return batch.count() ? s.index->commit(batch, /*sync=*/true) : ok_status();
  };

  std::set<uint64_t> on_disk;
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(s.segments_dir(), ec)) {
    uint64_t id;
    if (SegmentFile::parse_file_name(f.path().filename().string(), id)) on_disk.insert(id);
  }
  if (ec) return io_error("list " + s.segments_dir() + ": " + ec.message());

  for (uint64_t id : corrupt_ids) {
    spdlog::error("ssd tier: segment {} has a damaged record; dropping its entries", id);
    KVTIER_RETURN_IF_ERROR(drop_entries(id, 0));
    SsdIndex::Batch b;
    b.remove_segment(id);
    KVTIER_RETURN_IF_ERROR(s.index->commit(b, true));
  }
  for (SegmentRecord rec : records) {
    const std::string path = s.segment_path(rec.id);
    if (!on_disk.count(rec.id)) {
      spdlog::error("ssd tier: segment file {} is missing; dropping its entries", path);
      KVTIER_RETURN_IF_ERROR(drop_entries(rec.id, 0));
      SsdIndex::Batch b;
      b.remove_segment(rec.id);
      KVTIER_RETURN_IF_ERROR(s.index->commit(b, true));
      continue;
    }
    on_disk.erase(rec.id);
    KVTIER_ASSIGN_OR_RETURN(auto file, SegmentFile::open_existing(path, rec.id, s.options.direct_io));
    if (file->size() < rec.watermark) {
      const uint64_t keep = file->size() / kRecordAlign * kRecordAlign;
      spdlog::error("ssd tier: segment file {} is {} bytes, shorter than the {} written to it; "
                    "dropping the entries past its end", path, file->size(), rec.watermark);
      const uint64_t before = s.metrics.recovery_dropped_entries.value();
      KVTIER_RETURN_IF_ERROR(drop_entries(rec.id, keep));
      const uint64_t dropped = s.metrics.recovery_dropped_entries.value() - before;
      rec.watermark = keep;
      rec.live_entries -= std::min(rec.live_entries, dropped);
      // Live bytes are recounted from the surviving entries.
      uint64_t live = 0;
      KVTIER_RETURN_IF_ERROR(s.index->scan_segment(rec.id, [&](uint64_t, const BlockHash& h) {
        auto e = s.index->get(h);
        if (e.ok() && e->has_value() && (*e)->segment == rec.id)
          live += record_padded((*e)->length);
      }));
      rec.live_bytes = live;
      SsdIndex::Batch b;
      b.put_segment(rec);
      KVTIER_RETURN_IF_ERROR(s.index->commit(b, true));
    }
    s.segments.add(rec, std::move(file));
  }
  // Files no record names: created by a writer that died before recording them.
  for (uint64_t id : on_disk) {
    const std::string path = s.segment_path(id);
    if (::unlink(path.c_str()) == 0) s.metrics.recovery_removed_orphan_files.inc();
    spdlog::warn("ssd tier: removed segment file {} that no record names", path);
  }
  return ok_status();
}

}  // namespace kvtier
