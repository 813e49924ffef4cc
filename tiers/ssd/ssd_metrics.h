// SsdTierMetrics: every outcome of the SSD tier — spills accepted, dropped (by reason), written,
// failed (by reason); reads, hits and corrupt records quarantined (by reason); reclaim and
// reinsertion; recovery at open; queue and capacity gauges; write and read latency.
#pragma once

#include "base/metrics/metrics.h"

namespace kvtier {

struct SsdTierMetrics {
  // Spill path.
  Counter spill_enqueued;
  Counter spill_dropped_queue_full;
  Counter spill_dropped_encode_failed;
  Counter spill_dropped_quota;     // its namespace was at its SSD quota
  Counter spill_dropped_shutdown;  // still queued when close() ran out of time
  Counter spill_written;
  Counter spill_bytes_written;     // padded record bytes
  Counter spill_failed_no_space;
  Counter spill_failed_io;
  Counter spill_failed_index;
  Counter write_batches;
  Histogram write_batch_seconds;   // submit to index commit
  // Read path.
  Counter reads;
  Counter read_hits;
  Counter read_misses;
  Counter read_from_queue;         // served from a block still waiting to be written
  Counter read_bytes;
  Counter read_ops;                // reads issued to the disk (one per run of adjacent records)
  Counter coalesced_reads;         // of those, reads that carried more than one record
  Counter corrupt_checksum;
  Counter corrupt_decode;
  Counter corrupt_identity;        // hash, tokens or layout differ from the request/entry
  Counter corrupt_index_value;
  Counter corrupt_out_of_bounds;   // entry points past what its segment holds
  Counter corrupt_io;              // the read itself failed
  Counter stale_entries;           // entry of a segment that no longer exists
  Histogram read_batch_seconds;
  // Space.
  Counter segments_created;
  Counter segments_reclaimed;
  Counter segments_sealed;         // closed early: a write or sync into it failed
  Counter entries_reclaimed;
  Counter reinserted;
  Counter reinsert_failed;
  Counter reinsert_skipped;  // read, but past the half segment a reclaim moves: reclaimed with it
  Counter erased;
  Counter erase_failed;  // the index would not record an erase (a full disk): the DELETE failed
  // Of the blocks that left (reclaimed, deleted), the bytes read at least once since they were
  // written and those never read: estimates from a 1-in-64 sample (WriteOutcomeSample).
  Counter left_read_bytes;
  Counter left_never_read_bytes;
  // Recovery at open.
  Counter recovery_dropped_entries;
  Counter recovery_removed_orphan_files;
  Gauge queue_bytes;
  Gauge segments;
  Gauge used_bytes;
  Gauge live_bytes;

  uint64_t corrupt_total() const {
    return corrupt_checksum.value() + corrupt_decode.value() + corrupt_identity.value() +
           corrupt_index_value.value() + corrupt_out_of_bounds.value() + corrupt_io.value();
  }
  void visit(MetricVisitor& v, uint64_t capacity_bytes) const;
};

}  // namespace kvtier
