// SsdReader: the SSD tier's read path. A request's blocks are looked up in the index together
// (MultiGet) and read together (one io_uring submit, O_DIRECT), on the calling thread with a ring
// borrowed from a pool. Every record is verified before it is served: bounds against its
// segment, the frame's checksums, the document, and the block's hash, tokens and layout against
// the request and the index entry. Any failure quarantines the entry (removes it from the index),
// is counted by reason and logged, and reads as a miss.
#pragma once

#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "tiers/ssd/io_uring_ring.h"
#include "tiers/ssd/ssd_state.h"
#include "tiers/tier.h"

namespace kvtier {

// Thread-safe.
class SsdReader {
 public:
  explicit SsdReader(SsdState& state) : state_(state) {}

  // Results in request order; misses and quarantined records are kNotFound.
  std::vector<Result<BlockRef>> read(std::span<const BlockRequest> requests);

 private:
  // A ring on loan from the pool, returned on destruction.
  class RingLease {
   public:
    RingLease(SsdReader& owner, std::unique_ptr<IoUringRing> ring)
        : owner_(owner), ring_(std::move(ring)) {}
    ~RingLease();
    RingLease(const RingLease&) = delete;
    RingLease& operator=(const RingLease&) = delete;
    IoUringRing& ring() { return *ring_; }

   private:
    SsdReader& owner_;
    std::unique_ptr<IoUringRing> ring_;
  };
  Result<std::unique_ptr<RingLease>> lease();
  void quarantine(const BlockHash& hash, const IndexEntry& entry, Counter& reason,
                  const std::string& why);

  SsdState& state_;
  std::mutex pool_mu_;  // guards pool_
  std::vector<std::unique_ptr<IoUringRing>> pool_;
};

}  // namespace kvtier
