// The index commit of one write group, once its records are on disk and synced: each new entry
// replaces an older copy of its block (that segment's live counters move down), the segments'
// watermarks move over the durable records before the entries become visible (readers check an
// entry against its segment's watermark), and everything goes into RocksDB as one WriteBatch.
// Namespace bytes, quota charges and metrics follow a commit that succeeded; a failed one leaves
// only free space below the watermarks (the data was durable already).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "tiers/ssd/ssd_state.h"
#include "tiers/ssd/write/spill_queue.h"

namespace kvtier {

// A record of a write group, written and synced.
struct DurableRecord {
  SpillItem* item = nullptr;
  uint64_t segment = 0, offset = 0;
  uint64_t checksum = 0;  // its frame's payload checksum
};

struct IndexCommitResult {
  std::vector<size_t> committed;  // positions in the records given; a moved record that lost to a
                                  // newer copy or to an erase is not among them
  Status status;                  // not ok: none of `committed` is in the index
};

// Commits `records` to the index; the caller holds state.index_mu (an erase takes it too, so a
// block erased before this commit is not indexed by it). Entries take sequence numbers from
// `next_seq` on.
IndexCommitResult commit_durable_records(SsdState& state, std::span<const DurableRecord> records, uint64_t& next_seq);

}  // namespace kvtier
