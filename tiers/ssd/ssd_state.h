// SsdState: what the SSD tier's front (SsdTier), its writer (SpillWriter) and its reader
// (SsdReader) share — the directory's index and segments, the layouts to decode with, metrics,
// and the lock that makes index read-modify-writes atomic against each other.
#pragma once

#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "base/log.h"
#include "serialize/block_events.h"
#include "serialize/layout_registry.h"
#include "tiers/namespace_usage.h"
#include "tiers/ssd/index/segment_table.h"
#include "tiers/ssd/index/ssd_index.h"
#include "tiers/ssd/namespace_traffic.h"
#include "tiers/ssd/ssd_metrics.h"
#include "tiers/ssd/ssd_options.h"

namespace kvtier {

// 4 KiB: records start and end on O_DIRECT boundaries.
inline constexpr uint64_t kRecordAlign = 4096;
// `n` bytes rounded up to whole O_DIRECT units: the room a record of n bytes takes on disk.
inline constexpr uint64_t record_padded(uint64_t n) {
  return (n + kRecordAlign - 1) / kRecordAlign * kRecordAlign;
}

// Remembers which blocks were read since they were written, so reclaim can move them (bounded:
// forgets everything when it grows past its limit, which only costs a missed reinsertion).
class ReadTracker {
 public:
  // Marks every hash of a read at once: one lock per read, not per block (a prefix of small blocks
  // marks a hundred; per block, the lock was 4-5 % of a restore's CPU).
  void mark_all(std::span<const BlockHash> hashes);
  // True (and forgets it) when `h` was read.
  bool take(const BlockHash& h);

 private:
  static constexpr size_t kMaxTracked = 1 << 20;
  std::mutex mu_;
  std::unordered_set<BlockHash> read_;
};

// Whether a sample of the blocks written (1 in 64, chosen by hash) was read before it left the
// SSD, so an operator can see how much of what the tier writes is written for nothing — the
// number an admission rule and a write budget are tuned by. Bounded: past kMaxTracked sampled
// blocks held at once, new ones go untracked until some leave (the estimate then covers fewer).
class WriteOutcomeSample {
 public:
  static constexpr uint64_t kOneIn = 64;
  static constexpr size_t kMaxTracked = 1 << 16;
  static bool sampled(const BlockHash& h) { return h.bytes[7] % kOneIn == 0; }

  explicit WriteOutcomeSample(SsdTierMetrics& metrics) : metrics_(metrics) {}
  // A block new to the index, of `bytes` on disk.
  void written(const BlockHash& h, uint64_t bytes);
  void read(std::span<const BlockHash> hashes);
  // Its entry left the index: counted as read or never read, scaled up by the sampling rate.
  void left(const BlockHash& h);

 private:
  struct Outcome {
    uint64_t bytes = 0;
    bool read = false;
  };
  SsdTierMetrics& metrics_;
  std::mutex mu_;
  std::unordered_map<BlockHash, Outcome> tracked_;
};

// Hashes erased while a block moved out of a reclaimed segment may be on its way back into the
// index: the writer must not bring them back. Forgotten whenever no move is in flight.
class ErasedDuringReinsert {
 public:
  void add(const BlockHash& h) {
    std::lock_guard lock(mu_);
    erased_.insert(h);
  }
  bool contains(const BlockHash& h) const {
    std::lock_guard lock(mu_);
    return erased_.count(h) > 0;
  }
  void clear() {
    std::lock_guard lock(mu_);
    erased_.clear();
  }

 private:
  mutable std::mutex mu_;
  std::unordered_set<BlockHash> erased_;
};

struct SsdState {
  SsdTierOptions options;
  std::shared_ptr<LayoutRegistry> layouts;
  std::unique_ptr<SsdIndex> index;
  SegmentTable segments;
  SsdTierMetrics metrics;
  ReadTracker reads;
  WriteOutcomeSample outcomes{metrics};
  NamespaceTraffic traffic;  // bytes written and read back per namespace
  // Bytes of records (queued or indexed) of each namespace with an SSD quota. Set at open; shared
  // by every directory of a striped tier, since a quota is the namespace's across all of them.
  std::shared_ptr<NamespaceUsage> namespaces;
  // Serializes every change to index entries and segment records, so "remove this entry if it is
  // still the one I read" cannot remove a newer one written in between.
  std::mutex index_mu;
  ErasedDuringReinsert erased_during_reinsert;
  // Told of every entry that enters or leaves the index, under index_mu (null: nobody).
  std::shared_ptr<BlockEventSink> events;
  LogThrottle corrupt_log;
  LogThrottle write_fail_log;

  std::string segments_dir() const { return options.dir + "/segments"; }
  std::string segment_path(uint64_t id) const;
  // Removes `hash`'s entry if it still equals `seen`, adjusting its segment's live counters and
  // its namespace's bytes.
  Status remove_entry_if(const BlockHash& hash, const IndexEntry& seen);
  // Removes an entry whose value cannot be decoded (its segment key is found by reclaim/fsck).
  Status remove_undecodable(const BlockHash& hash);
  // The same, for a caller that holds index_mu.
  Status remove_entry_if_locked(const BlockHash& hash, const IndexEntry& seen);
  Status remove_undecodable_locked(const BlockHash& hash);
  void refresh_space_gauges();
};

}  // namespace kvtier
