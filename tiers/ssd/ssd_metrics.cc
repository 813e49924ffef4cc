#include "tiers/ssd/ssd_metrics.h"

namespace kvtier {

void SsdTierMetrics::visit(MetricVisitor& v, uint64_t capacity_bytes) const {
  v.counter("kvtier_spill_enqueued_total", "Blocks accepted for writing to SSD", {}, spill_enqueued.value());
  v.counter("kvtier_spill_dropped_total", "Blocks not written to SSD", {{"reason", "queue_full"}},
            spill_dropped_queue_full.value());
  v.counter("kvtier_spill_dropped_total", "Blocks not written to SSD", {{"reason", "encode_failed"}},
            spill_dropped_encode_failed.value());
  v.counter("kvtier_spill_dropped_total", "Blocks not written to SSD", {{"reason", "quota"}},
            spill_dropped_quota.value());
  v.counter("kvtier_spill_dropped_total", "Blocks not written to SSD", {{"reason", "shutdown"}},
            spill_dropped_shutdown.value());
  v.counter("kvtier_spill_written_total", "Blocks written and indexed", {}, spill_written.value());
  v.counter("kvtier_spill_bytes_written_total", "Record bytes written (4 KiB padded)", {},
            spill_bytes_written.value());
  v.counter("kvtier_spill_failed_total", "Writes that failed", {{"reason", "no_space"}},
            spill_failed_no_space.value());
  v.counter("kvtier_spill_failed_total", "Writes that failed", {{"reason", "io_error"}},
            spill_failed_io.value());
  v.counter("kvtier_spill_failed_total", "Writes that failed", {{"reason", "index"}},
            spill_failed_index.value());
  v.counter("kvtier_ssd_write_batches_total", "Write batches (one submit, one fdatasync each)", {},
            write_batches.value());
  v.histogram("kvtier_ssd_write_batch_seconds", "Write batch latency, submit to index commit", {},
              write_batch_seconds.snapshot());
  v.counter("kvtier_ssd_written_never_read_bytes",
            "Record bytes written that left the SSD (reclaimed or deleted) without being read "
            "once; an estimate "
            "from a 1-in-64 sample of blocks",
            {}, left_never_read_bytes.value());
  v.counter("kvtier_ssd_written_read_bytes",
            "Record bytes written that were read at least once before they left the SSD; an "
            "estimate from the "
            "same sample",
            {}, left_read_bytes.value());
  v.counter("kvtier_ssd_reads_total", "Blocks asked of the SSD tier", {}, reads.value());
  v.counter("kvtier_ssd_read_hits_total", "Blocks returned intact", {}, read_hits.value());
  v.counter("kvtier_ssd_read_misses_total", "Blocks not held (or not intact)", {}, read_misses.value());
  v.counter("kvtier_ssd_read_from_queue_total", "Reads served from the spill queue", {},
            read_from_queue.value());
  v.counter("kvtier_ssd_read_bytes_total", "Record bytes read", {}, read_bytes.value());
  v.counter("kvtier_ssd_read_ops_total", "Reads issued to the disk (one per run of adjacent records)", {},
            read_ops.value());
  v.counter("kvtier_ssd_coalesced_reads_total", "Reads that carried several adjacent records", {},
            coalesced_reads.value());
  const std::pair<const char*, const Counter*> corrupt[] = {
      {"checksum", &corrupt_checksum},     {"decode", &corrupt_decode},
      {"identity", &corrupt_identity},     {"index_value", &corrupt_index_value},
      {"out_of_bounds", &corrupt_out_of_bounds}, {"io_error", &corrupt_io}};
  for (const auto& [reason, c] : corrupt) {
    v.counter("kvtier_ssd_corrupt_total", "Records that failed a check: quarantined, never served",
              {{"reason", reason}}, c->value());
  }
  v.counter("kvtier_ssd_stale_entries_total", "Entries of reclaimed segments", {}, stale_entries.value());
  v.histogram("kvtier_ssd_read_batch_seconds", "Read batch latency", {}, read_batch_seconds.snapshot());
  v.counter("kvtier_ssd_segments_created_total", "Segments created", {}, segments_created.value());
  v.counter("kvtier_ssd_segments_reclaimed_total", "Segments reclaimed (oldest first)", {},
            segments_reclaimed.value());
  v.counter("kvtier_ssd_segments_sealed_total",
            "Segments closed to new records because a write or sync into them failed", {},
            segments_sealed.value());
  v.counter("kvtier_ssd_entries_reclaimed_total", "Entries removed with their segment", {},
            entries_reclaimed.value());
  v.counter("kvtier_ssd_reinserted_total", "Read blocks moved out of a reclaimed segment", {},
            reinserted.value());
  v.counter("kvtier_ssd_reinsert_failed_total", "Reinsertions that failed", {}, reinsert_failed.value());
  v.counter(
      "kvtier_ssd_reinsert_skipped_total",
      "Read blocks reclaimed with their segment because a reclaim moves at most half a segment", {},
      reinsert_skipped.value());
  v.counter("kvtier_ssd_erased_total", "Entries removed on request", {}, erased.value());
  v.counter("kvtier_ssd_erase_failures_total", "Erases the index would not record (the delete failed)", {},
            erase_failed.value());
  v.counter("kvtier_ssd_recovery_dropped_entries_total",
            "Entries dropped at open (pointing past what their segment holds)", {},
            recovery_dropped_entries.value());
  v.counter("kvtier_ssd_recovery_removed_files_total", "Segment files without a record, removed", {},
            recovery_removed_orphan_files.value());
  v.gauge("kvtier_spill_queue_bytes", "Bytes waiting for (or being written by) the SSD writer", {},
          static_cast<double>(queue_bytes.value()));
  v.gauge("kvtier_ssd_segments", "Segment files", {}, static_cast<double>(segments.value()));
  v.gauge("kvtier_ssd_used_bytes", "Bytes allocated to segments", {}, static_cast<double>(used_bytes.value()));
  v.gauge("kvtier_ssd_live_bytes", "Bytes of indexed records", {}, static_cast<double>(live_bytes.value()));
  v.gauge("kvtier_ssd_capacity_bytes", "SSD tier capacity", {}, static_cast<double>(capacity_bytes));
}

}  // namespace kvtier
