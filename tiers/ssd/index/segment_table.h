// SegmentTable: the SSD tier's segments in memory — each segment's file and its durable record
// (watermark, live bytes) — in creation order, which is also reclaim order (FIFO, as flash caches
// do to avoid write amplification). Readers look files up here; the writer appends and reclaims.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "tiers/ssd/io/segment_file.h"
#include "tiers/ssd/index/ssd_index.h"

namespace kvtier {

// Thread-safe.
class SegmentTable {
 public:
  void add(const SegmentRecord& record, std::shared_ptr<SegmentFile> file);
  void remove(uint64_t id);
  // nullptr when the segment is gone (reclaimed or never existed).
  std::shared_ptr<SegmentFile> file(uint64_t id) const;
  std::optional<SegmentRecord> record(uint64_t id) const;
  // Adds to a segment's live counters and returns the updated record (nullopt if gone).
  std::optional<SegmentRecord> add_live(uint64_t id, int64_t bytes, int64_t entries);
  std::optional<SegmentRecord> set_watermark(uint64_t id, uint64_t watermark);

  // The oldest segment not in `except` (the writer's active segments).
  std::optional<uint64_t> oldest(std::span<const uint64_t> except) const;
  std::vector<SegmentRecord> records() const;
  size_t count() const;
  uint64_t live_bytes() const;
  uint64_t max_id() const;

 private:
  struct Slot {
    SegmentRecord record;
    std::shared_ptr<SegmentFile> file;
  };
  mutable std::mutex mu_;
  std::map<uint64_t, Slot> slots_;  // by id: ids grow, so this is creation order
};

}  // namespace kvtier
