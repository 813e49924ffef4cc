#include "tiers/ssd/ssd_fsck.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>

#include "base/memory/aligned_buffer.h"
#include "tiers/ssd/index/ssd_index.h"
#include "tiers/ssd/index/ssd_manifest.h"
#include "tiers/ssd/io/dir_lock.h"
#include "tiers/ssd/io/segment_file.h"
#include "tiers/ssd/read/record_check.h"
#include "tiers/ssd/ssd_state.h"

namespace kvtier {

namespace fs = std::filesystem;

namespace {

struct Segment {
  std::optional<SegmentRecord> record;
  std::shared_ptr<SegmentFile> file;
  uint64_t live_bytes = 0;
  uint64_t live_entries = 0;
};

}  // namespace

Result<FsckReport> fsck_ssd_dir(const std::string& dir, const FsckOptions& options) {
  if (!fs::is_directory(dir)) return not_found(dir + " is not a directory");
  KVTIER_ASSIGN_OR_RETURN(std::optional<SsdManifest> manifest, SsdManifest::load(dir));
  if (!manifest) return invalid_argument(dir + " is not a kvtier SSD cache (no MANIFEST.json)");
  KVTIER_ASSIGN_OR_RETURN(DirLock lock, DirLock::acquire(dir));
  LayoutRegistry layouts;
  for (const KvLayout& l : manifest->layouts) KVTIER_RETURN_IF_ERROR(layouts.add(l).status());
  SsdIndexOptions index_options;
  index_options.held_in_memory = false;
  KVTIER_ASSIGN_OR_RETURN(auto index, SsdIndex::open(dir + "/index", index_options));

  FsckReport report;
  auto problem = [&](std::string line) {
    if (report.problems.size() < 100) report.problems.push_back(std::move(line));
  };

  std::map<uint64_t, Segment> segments;
  std::vector<SegmentRecord> records;
  std::vector<uint64_t> bad_records;
  KVTIER_RETURN_IF_ERROR(index->load_segments(records, bad_records));
  for (uint64_t id : bad_records) problem("segment " + std::to_string(id) + ": record fails its checks");
  for (const SegmentRecord& r : records) segments[r.id].record = r;
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(dir + "/segments", ec)) {
    uint64_t id;
    if (!SegmentFile::parse_file_name(f.path().filename().string(), id)) continue;
    auto file = SegmentFile::open_existing(f.path().string(), id, /*direct_io=*/false);
    if (!file.ok()) {
      problem(file.status().message());
      continue;
    }
    segments[id].file = *file;
  }
  for (auto& [id, s] : segments) {
    if (!s.file) continue;
    ++report.segments;
    report.segment_bytes += s.file->size();
    if (!s.record) {
      ++report.orphan_files;
      report.orphaned_bytes += s.file->size();
      problem("segment file " + s.file->path() + ": no record names it (orphaned)");
    }
  }

  std::vector<std::pair<BlockHash, Result<IndexEntry>>> entries;
  KVTIER_RETURN_IF_ERROR(index->scan_entries(
      [&](const BlockHash& h, const Result<IndexEntry>& e) { entries.emplace_back(h, e); }));
  report.entries = entries.size();
  // Disk order: on a directory of millions of records, one pass front to back over each segment
  // instead of a seek per entry (index order is hash order).
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
    const auto key = [](const Result<IndexEntry>& e) {
      return e.ok() ? std::pair(e->segment, e->offset) : std::pair(uint64_t{0}, uint64_t{0});
    };
    return key(a.second) < key(b.second);
  });
  FsckProgress progress{0, entries.size(), 0, 0};
  for (const auto& [hash, e] : entries) {
    if (e.ok()) progress.bytes_total += e->length;
  }

  SsdIndex::Batch repairs;
  BlockCodec codec;
  for (size_t i = 0; i < entries.size(); ++i) {
    progress.entries_done = i;
    if (options.progress && (i % 64 == 0)) options.progress(progress);
    if (entries[i].second.ok()) progress.bytes_done += entries[i].second->length;
    const BlockHash& hash = entries[i].first;
    const Result<IndexEntry>& er = entries[i].second;
    if (!er.ok()) {
      ++report.bad_index_values;
      problem("block " + hash.hex() + ": " + er.status().message());
      repairs.remove_primary(hash);
      continue;
    }
    const IndexEntry& e = *er;
    auto it = segments.find(e.segment);
    if (it == segments.end() || !it->second.file || !it->second.record) {
      ++report.missing_segment;
      problem("block " + hash.hex() + ": names segment " + std::to_string(e.segment) +
              ", which does not exist");
      repairs.remove(hash, e);
      continue;
    }
    Segment& seg = it->second;
    auto bad = [&](const std::string& why) {
      ++report.corrupt;
      problem("block " + hash.hex() + " (segment " + std::to_string(e.segment) + " offset " +
              std::to_string(e.offset) + "): " + why);
      repairs.remove(hash, e);
    };
    if (e.offset % kRecordAlign != 0 || e.length < kFrameHeaderSize ||
        e.offset + e.length > seg.record->watermark || e.offset + e.length > seg.file->size()) {
      bad("points past what its segment holds");
      continue;
    }
    AlignedBuffer buf(record_padded(e.length), kRecordAlign, /*zeroed=*/false);
    const ssize_t n = ::pread(seg.file->fd(), buf.data(), e.length, static_cast<off_t>(e.offset));
    if (n != static_cast<ssize_t>(e.length)) {
      bad(n < 0 ? errno_status("read", errno).message() : "short read");
      continue;
    }
    RecordCheck check = check_record(std::move(buf), e, BlockRequest{hash, {}}, layouts, codec);
    if (check.fault != RecordFault::kNone) {
      bad(check.why);
      continue;
    }
    ++report.ok;
    report.live_bytes += record_padded(e.length);
    seg.live_bytes += record_padded(e.length);
    seg.live_entries += 1;
  }
  progress.entries_done = entries.size();
  progress.bytes_done = progress.bytes_total;
  if (options.progress) options.progress(progress);

  // Written bytes no passing entry accounts for (superseded copies, failed batches, records that
  // failed their checks). Space past the watermark is free, not orphaned.
  for (auto& [id, s] : segments) {
    if (!s.file || !s.record) continue;
    const uint64_t written = std::min(s.record->watermark, s.file->size());
    report.orphaned_bytes += written - std::min(written, s.live_bytes);
  }

  if (options.repair) {
    for (auto& [id, s] : segments) {
      if (!s.record) continue;
      SegmentRecord r = *s.record;
      r.live_bytes = s.live_bytes;
      r.live_entries = s.live_entries;
      repairs.put_segment(r);
    }
    for (uint64_t id : bad_records) repairs.remove_segment(id);
    KVTIER_RETURN_IF_ERROR(index->commit(repairs, /*sync=*/true));
    for (auto& [id, s] : segments) {
      if (s.file && !s.record && ::unlink(s.file->path().c_str()) == 0) ++report.repaired;
    }
    report.repaired += report.corrupt + report.bad_index_values + report.missing_segment;
  }
  return report;
}

}  // namespace kvtier
