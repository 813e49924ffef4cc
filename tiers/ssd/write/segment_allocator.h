// SegmentAllocator: where the spill writer's records go on disk, after CacheLib Navy's region
// manager. It keeps one active segment per lane (SsdTierOptions::active_segments), hands each
// record a place in the current lane's segment, opens a new segment when that one is full, and
// keeps the tier within its capacity by reclaiming the oldest segment (FIFO) first, moving the
// blocks read since they were written back into the writer's path (reinsertion) so a hot block
// outlives its segment. A new segment is in the index before anything is placed in it, and a
// reclaimed one leaves the index (synced) before its file is unlinked.
//
// The writer thread's alone: not thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "base/status.h"
#include "tiers/ssd/io/io_uring_ring.h"
#include "tiers/ssd/ssd_state.h"
#include "tiers/ssd/write/spill_queue.h"

namespace kvtier {

class SegmentAllocator {
 public:
  struct Hooks {
    // Before a reclaim: finishes every write in flight, so none lands in the segment it removes.
    std::function<void()> drain;
    // A block moved out of a segment being reclaimed, framed already, to be written again.
    std::function<void(SpillItemPtr)> reinsert;
    // A segment is gone: the writer forgets what it knew of it.
    std::function<void(uint64_t segment)> reclaimed;
  };
  SegmentAllocator(SsdState& state, Hooks hooks);

  // Sets up the lanes and reclaims down to capacity. `ring` serves a reclaim's reads, which run
  // with nothing else in flight on it.
  Status start(IoUringRing& ring);

  // Turns to the next lane: write groups take turns between the active segments.
  void next_lane() { lane_ = (lane_ + 1) % lanes_.size(); }
  // Whether `size` bytes fit the current lane's segment without opening another.
  bool fits(uint64_t size) const;
  struct Place {
    uint64_t segment = 0, offset = 0;
  };
  // Room for `size` bytes in the current lane's segment; opens a new one (reclaiming the oldest
  // first when the tier is full) when it has none left.
  Result<Place> place(uint64_t size);
  // Nothing more is placed in `segment` (a write or sync into it failed). False when it was not
  // active (already sealed, or rotated away).
  bool seal(uint64_t segment);

 private:
  struct Lane {
    std::optional<uint64_t> segment;
    std::shared_ptr<SegmentFile> file;
    uint64_t cursor = 0;
  };
  uint64_t max_segments() const;
  Status rotate();
  Status open_segment();
  // The ids of the active segments (reclaim leaves them alone).
  std::vector<uint64_t> active_ids() const;
  // Reclaims the oldest segments until `room` more fit within the capacity.
  Status enforce_capacity(uint64_t room);
  Status reclaim(uint64_t segment);
  // Reads the records of `segment` read since they were written and hands them to the reinsert
  // hook; returns how many.
  size_t move_read_blocks(uint64_t segment, const std::shared_ptr<SegmentFile>& file,
                          std::span<const std::pair<uint64_t, BlockHash>> records);

  SsdState& state_;
  Hooks hooks_;
  IoUringRing* ring_ = nullptr;
  std::vector<Lane> lanes_;
  size_t lane_ = 0;
};

}  // namespace kvtier
