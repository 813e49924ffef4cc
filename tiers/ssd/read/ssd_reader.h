// SsdReader: the SSD tier's read path. A request's blocks are looked up in the index together
// (MultiGet) and read together (one io_uring submit, O_DIRECT), on the calling thread with a ring
// borrowed from a pool; with coalesce_read_bytes, records that lie back to back on disk are read
// as one op and split after. Every record is verified before it is served: bounds against its
// segment, the frame's checksums, the document, and the block's hash, tokens and layout against
// the request and the index entry. Any failure quarantines the entry (removes it from the index),
// is counted by reason and logged, and reads as a miss.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "tiers/ssd/io/io_uring_ring.h"
#include "tiers/ssd/ssd_state.h"
#include "tiers/tier.h"

namespace kvtier {

// Thread-safe.
class SsdReader {
 public:
  explicit SsdReader(SsdState& state) : state_(state) {}

  // Results in request order; misses and quarantined records are kNotFound. A large batch of
  // small records is split over a few threads, since verifying a record costs CPU time that the
  // disk does not wait for (a 16 KiB block's checks cost about as much as a 2 MiB block's).
  std::vector<Result<BlockRef>> read(std::span<const BlockRequest> requests);

 private:
  // read() for one thread's share of a batch.
  std::vector<Result<BlockRef>> read_part(std::span<const BlockRequest> requests);
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

  // One record to read, and what its read gave.
  struct Pending {
    size_t request;
    IndexEntry entry;
    std::shared_ptr<SegmentFile> file;  // held: a reclaim cannot pull the inode away mid-read
    AlignedBuffer buffer;               // the record, padded to 4 KiB
    uint64_t done = 0;                  // bytes read
    int error = 0;                      // errno of a failed read
    bool settled = false;               // verified (served or quarantined), or failed
  };
  // Records (indices into the pending list) read by one op: adjacent, in offset order.
  struct ReadRun {
    std::vector<size_t> records;
    uint64_t offset = 0;
    uint64_t length = 0;
  };
  // `order`: the pending records sorted by (segment, offset).
  std::vector<ReadRun> plan_runs(const std::vector<Pending>& pending, const std::vector<size_t>& order) const;
  // Reads every run and fills each record's buffer, done and error, handing each record to
  // `settle` as soon as its bytes are in (while later reads are still in flight); a merged read
  // that fails is retried record by record. Non-ok only when the ring itself fails.
  Status run_runs(IoUringRing& ring, std::vector<Pending>& pending, std::vector<ReadRun>& runs,
                  const std::function<void(Pending&)>& settle);
  void quarantine(const BlockHash& hash, const IndexEntry& entry, Counter& reason,
                  const std::string& why);

  SsdState& state_;
  std::mutex pool_mu_;  // guards pool_
  std::vector<std::unique_ptr<IoUringRing>> pool_;
};

}  // namespace kvtier
