#include "tiers/ssd/ssd_reader.h"

#include <algorithm>
#include <chrono>

#include "tiers/ssd/record_check.h"

namespace kvtier {

SsdReader::RingLease::~RingLease() {
  std::lock_guard lock(owner_.pool_mu_);
  owner_.pool_.push_back(std::move(ring_));
}

Result<std::unique_ptr<SsdReader::RingLease>> SsdReader::lease() {
  {
    std::lock_guard lock(pool_mu_);
    if (!pool_.empty()) {
      auto ring = std::move(pool_.back());
      pool_.pop_back();
      return std::make_unique<RingLease>(*this, std::move(ring));
    }
  }
  KVTIER_ASSIGN_OR_RETURN(auto ring, IoUringRing::create(std::max(8u, state_.options.reader_queue_depth)));
  return std::make_unique<RingLease>(*this, std::move(ring));
}

void SsdReader::quarantine(const BlockHash& hash, const IndexEntry& entry, Counter& reason,
                           const std::string& why) {
  reason.inc();
  Status st = state_.remove_entry_if(hash, entry);
  if (auto n = state_.corrupt_log.admit()) {
    spdlog::error("ssd tier: quarantined block {} (segment {} offset {}): {}{} ({} similar "
                  "suppressed)",
                  hash.hex(), entry.segment, entry.offset, why,
                  st.ok() ? "" : "; removing its entry failed: " + st.to_string(), *n);
  }
}

std::vector<Result<BlockRef>> SsdReader::read(std::span<const BlockRequest> requests) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Result<BlockRef>> out;
  out.reserve(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) out.emplace_back(not_found("ssd tier: not held"));
  state_.metrics.reads.inc(requests.size());

  std::vector<BlockHash> hashes;
  for (const BlockRequest& r : requests) hashes.push_back(r.hash);
  auto entries = state_.index->multi_get(hashes);

  struct Pending {
    size_t request;
    IndexEntry entry;
    std::shared_ptr<SegmentFile> file;  // held: a reclaim cannot pull the inode away mid-read
    AlignedBuffer buffer;
  };
  std::vector<Pending> pending;
  for (size_t i = 0; i < requests.size(); ++i) {
    if (!entries[i].ok()) {
      state_.metrics.corrupt_index_value.inc();
      (void)state_.remove_undecodable(requests[i].hash);
      if (auto n = state_.corrupt_log.admit()) {
        spdlog::error("ssd tier: quarantined index entry of block {}: {} ({} similar suppressed)",
                      requests[i].hash.hex(), entries[i].status().message(), *n);
      }
      continue;
    }
    if (!entries[i]->has_value()) continue;
    const IndexEntry& e = **entries[i];
    auto file = state_.segments.file(e.segment);
    auto record = state_.segments.record(e.segment);
    if (!file || !record) {
      state_.metrics.stale_entries.inc();  // reclaimed between lookup and read: just a miss
      continue;
    }
    if (e.offset % kRecordAlign != 0 || e.length < kFrameHeaderSize ||
        e.offset + e.length > record->watermark || e.offset + e.length > file->size()) {
      quarantine(requests[i].hash, e, state_.metrics.corrupt_out_of_bounds,
                 "entry points past what the segment holds (watermark " +
                     std::to_string(record->watermark) + ")");
      continue;
    }
    const uint64_t len = (e.length + kRecordAlign - 1) / kRecordAlign * kRecordAlign;
    pending.push_back({i, e, std::move(file), AlignedBuffer(len, kRecordAlign, /*zeroed=*/false)});
  }

  if (!pending.empty()) {
    std::vector<IoOp> ops;
    ops.reserve(pending.size());
    for (Pending& p : pending) {
      ops.push_back({IoOp::Kind::kRead, p.file->fd(), p.buffer.data(), p.buffer.size(), p.entry.offset});
    }
    Status ring_status;
    auto lease_or = lease();
    if (!lease_or.ok()) {
      ring_status = lease_or.status();
    } else {
      ring_status = run_io_batch((*lease_or)->ring(), ops);
    }
    thread_local BlockCodec codec;
    for (size_t k = 0; k < pending.size(); ++k) {
      Pending& p = pending[k];
      const BlockRequest& req = requests[p.request];
      if (!ring_status.ok()) {
        out[p.request] = ring_status;  // the ring failed, not the record: no quarantine
        continue;
      }
      if (ops[k].error) {
        quarantine(req.hash, p.entry, state_.metrics.corrupt_io,
                   errno_status("read", ops[k].error).message());
        continue;
      }
      if (ops[k].done < p.entry.length) {
        quarantine(req.hash, p.entry, state_.metrics.corrupt_out_of_bounds,
                   "segment ends " + std::to_string(p.entry.length - ops[k].done) +
                       " bytes before the record does");
        continue;
      }
      state_.metrics.read_bytes.inc(ops[k].done);
      RecordCheck check = check_record(std::move(p.buffer), p.entry, req, *state_.layouts, codec);
      if (check.fault != RecordFault::kNone) {
        Counter& reason = check.fault == RecordFault::kChecksum ? state_.metrics.corrupt_checksum
                          : check.fault == RecordFault::kDecode ? state_.metrics.corrupt_decode
                                                                : state_.metrics.corrupt_identity;
        quarantine(req.hash, p.entry, reason, check.why);
        continue;
      }
      state_.reads.mark(req.hash);
      out[p.request] = BlockRef(std::make_shared<const Block>(std::move(*check.block)));
    }
  }
  for (const auto& r : out) {
    if (r.ok()) state_.metrics.read_hits.inc();
    else state_.metrics.read_misses.inc();
  }
  state_.metrics.read_batch_seconds.observe(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return out;
}

}  // namespace kvtier
