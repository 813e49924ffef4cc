// SpillWriter: the SSD tier's one writer thread ("spill-writer"), an io_uring event loop that
// keeps the disk busy. Blocks taken from the spill queue are framed (compressed if asked), given
// a place in the active segment and written at once, many in flight (up to a byte budget), as a
// group per queue pop. When a group's writes have all completed, its segments are fdatasync'd;
// when that sync completes, the group's index entries are committed in one RocksDB WriteBatch —
// groups commit strictly in order, so an index entry never points at data that is not on disk
// and a newer copy of a block is never overwritten by an older one. Framing and checksums of the
// next group overlap the previous group's I/O.
//
// Every failure is counted and logged with its errno; the failing blocks are dropped, the segment
// the failure hit is sealed (nothing more is placed in it), and the writer carries on. Where each
// record goes, and which segment is reclaimed when the tier is full, is the SegmentAllocator's;
// a reclaim first drains everything in flight.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "serialize/format/frame.h"
#include "tiers/ssd/io/io_uring_ring.h"
#include "tiers/ssd/ssd_state.h"
#include "tiers/ssd/write/index_commit.h"
#include "tiers/ssd/write/record_framer.h"
#include "tiers/ssd/write/segment_allocator.h"
#include "tiers/ssd/write/spill_queue.h"

namespace kvtier {

class SpillWriter {
 public:
  // Decides, just before an item's index entry is committed, whether it is still wanted (the tier
  // may have erased it while it was queued).
  using StillWanted = std::function<bool(const SpillItem&)>;
  // Called after each group with every item of it, written or not.
  using Done = std::function<void(const std::vector<SpillItemPtr>&)>;

  SpillWriter(SsdState& state, SpillQueue& queue, StillWanted still_wanted, Done done);
  ~SpillWriter();

  // Reclaims down to capacity, then starts the thread.
  Status start();
  // Waits for the thread to drain the (closed) queue; past `deadline` it stops taking items,
  // finishes what is in flight, and what is left is dropped and counted. Returns the number of
  // blocks dropped.
  size_t stop(std::chrono::steady_clock::time_point deadline);
  // Blocks until every item with ticket <= `ticket` has been written or failed, and no block
  // moved by a reclaim is still on its way back into the index.
  void wait_for(uint64_t ticket);

 private:
  struct Group;
  // One io_uring operation; its address is the SQE's user data.
  struct Op {
    enum class Kind { kWrite, kSync } kind = Kind::kWrite;
    Group* group = nullptr;
    size_t record = 0;    // kWrite: index into group->records
    uint64_t segment = 0; // kSync
    int fd = -1;
    uint8_t* buffer = nullptr;
    uint64_t length = 0, offset = 0, done = 0;
  };
  struct Record {
    SpillItemPtr item;
    FrameHeader header;
    AlignedBuffer compressed;  // frame of a compressed item (codec != none)
    uint64_t segment = 0, offset = 0;
    bool ok = false;  // framed, placed, written (and later synced)
    Op write;
  };
  struct Group {
    std::vector<Record> records;
    size_t writes_outstanding = 0;
    std::map<uint64_t, std::shared_ptr<SegmentFile>> segments;  // touched by successful writes
    std::vector<std::unique_ptr<Op>> syncs;
    size_t syncs_outstanding = 0;
    bool sync_submitted = false;
    uint64_t bytes = 0;
    std::chrono::steady_clock::time_point started;
  };

  void run();
  // Takes items off the queue (and reinsertions) into a new group and submits their writes.
  void start_group(std::vector<SpillItemPtr> items);
  // Frames an item (RecordFramer). False (counted) when it cannot be.
  bool frame(Record& record);

  void submit_write(Op& op);
  void submit_syncs(Group& g);
  // Submits queued SQEs; waits for at least one completion when `wait` (and one is owed);
  // handles all ready ones.
  void reap(bool wait);
  void on_complete(Op& op, int res);
  // Syncs and commits finished groups, oldest first.
  void advance();
  void commit(Group& g);
  void finish(Group& g);
  // Runs the loop until nothing is in flight.
  void drain();

  void fail(const SpillItem& item, const Status& why);
  // After a failed write or sync into `segment`, nothing more is placed there: what the disk
  // refused once it may refuse again, and a failed fdatasync leaves the file's state unknown.
  void seal(uint64_t segment, const Status& why);
  // A framed block moved out of a reclaimed segment, written again with the next group.
  void reinsert(SpillItemPtr item);

  SsdState& state_;
  SpillQueue& queue_;
  StillWanted still_wanted_;
  Done done_;
  std::unique_ptr<IoUringRing> ring_;
  RecordFramer framer_;
  std::thread thread_;
  std::atomic<std::chrono::steady_clock::time_point::rep> deadline_{0};

  // Writer-thread state.
  SegmentAllocator segments_;
  uint64_t next_seq_ = 0;
  std::deque<SpillItemPtr> reinserts_;          // framed records moved out of a reclaimed segment
  // Segments whose fdatasync failed: records of later groups in them are not trusted either (the
  // kernel reports a writeback error once, so a later sync may succeed over lost pages).
  std::map<uint64_t, int> failed_sync_;  // segment -> errno
  std::deque<std::unique_ptr<Group>> groups_;   // in flight, oldest first
  uint64_t inflight_bytes_ = 0;
  unsigned unsubmitted_ = 0;                    // SQEs prepared but not yet submitted
  size_t inflight_ops_ = 0;                     // operations the kernel still owes a completion

  std::mutex done_mu_;  // guards completed_, reinserts_outstanding_ and finished_
  std::condition_variable done_cv_;
  uint64_t completed_ = 0;
  size_t reinserts_outstanding_ = 0;  // moved blocks read but not yet committed (or dropped)
  bool finished_ = false;
};

}  // namespace kvtier
