#include "tiers/ssd/read/ssd_reader.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "base/elapsed.h"
#include "base/threads/worker_pool.h"
#include "tiers/ssd/read/record_check.h"

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
  state_.corrupt_log.error("ssd tier: quarantined block {} (segment {} offset {}): {}{}",
                           hash.hex(), entry.segment, entry.offset, why,
                           st.ok() ? "" : "; removing its entry failed: " + st.to_string());
}

namespace {

uint64_t padded_length(const IndexEntry& e) { return (e.length + kRecordAlign - 1) / kRecordAlign * kRecordAlign; }

}  // namespace

std::vector<SsdReader::ReadRun> SsdReader::plan_runs(const std::vector<Pending>& pending,
                                                     const std::vector<size_t>& order) const {
  const uint64_t max_run = state_.options.coalesce_read_bytes;
  std::vector<ReadRun> runs;
  for (size_t k : order) {
    const IndexEntry& e = pending[k].entry;
    const uint64_t len = padded_length(e);
    if (!runs.empty() && max_run > 0) {
      ReadRun& last = runs.back();
      const IndexEntry& prev = pending[last.records.back()].entry;
      // A record no larger than a run can take, right after the last one in the same segment
      // (the same file, still held by both).
      if (prev.segment == e.segment && prev.offset + padded_length(prev) == e.offset && last.length + len <= max_run) {
        last.records.push_back(k);
        last.length += len;
        continue;
      }
    }
    runs.push_back({{k}, e.offset, len});
  }
  return runs;
}

Status SsdReader::run_runs(IoUringRing& ring, std::vector<Pending>& pending, std::vector<ReadRun>& runs,
                           const std::function<void(Pending&)>& settle) {
  // Every record is read straight into the buffer its block will keep; a run of several is one
  // vectored read (a copy out of one run buffer was 11 % of a 16 KiB-block restore's CPU).
  std::vector<IoOp> ops;
  ops.reserve(runs.size());
  for (ReadRun& run : runs) {
    IoOp op = IoOp::read(pending[run.records.front()].file->fd(), nullptr, run.length, run.offset);
    for (size_t k : run.records) {
      Pending& p = pending[k];
      p.buffer = AlignedBuffer(padded_length(p.entry), kRecordAlign, /*zeroed=*/false);
      if (run.records.size() == 1) {
        op.buffer = p.buffer.data();
      } else {
        op.pieces.push_back({p.buffer.data(), p.buffer.size()});
      }
    }
    if (run.records.size() > 1) state_.metrics.coalesced_reads.inc();
    ops.push_back(std::move(op));
  }
  state_.metrics.read_ops.inc(ops.size());

  std::vector<size_t> retry;  // records of merged reads that failed: read alone, so one bad
                              // sector costs only its own record
  KVTIER_RETURN_IF_ERROR(run_io_batch(ring, ops, [&](size_t r) {
    const ReadRun& run = runs[r];
    if (run.records.size() == 1) {
      Pending& p = pending[run.records.front()];
      p.error = ops[r].error;
      p.done = ops[r].done;
      settle(p);
      return;
    }
    if (ops[r].error) {
      retry.insert(retry.end(), run.records.begin(), run.records.end());
      return;
    }
    for (size_t k : run.records) {
      Pending& p = pending[k];
      const uint64_t at = p.entry.offset - run.offset, len = padded_length(p.entry);
      p.done = ops[r].done > at ? std::min(ops[r].done - at, len) : 0;
      settle(p);
    }
  }));
  if (retry.empty()) return ok_status();
  std::vector<IoOp> alone;
  for (size_t k : retry) {
    Pending& p = pending[k];  // its buffer, not settled, is still its own
    alone.push_back(IoOp::read(p.file->fd(), p.buffer.data(), p.buffer.size(), p.entry.offset));
  }
  state_.metrics.read_ops.inc(alone.size());
  return run_io_batch(ring, alone, [&](size_t i) {
    Pending& p = pending[retry[i]];
    p.error = alone[i].error;
    p.done = alone[i].done;
    settle(p);
  });
}

std::vector<Result<BlockRef>> SsdReader::read(std::span<const BlockRequest> requests) {
  // Parts of at least kPartRequests requests, on up to kMaxParts threads (this one included).
  constexpr size_t kPartRequests = 32, kMaxParts = 4;
  const size_t parts = std::min<size_t>({kMaxParts, requests.size() / kPartRequests,
                                         std::max(1u, std::thread::hardware_concurrency())});
  if (parts <= 1) return read_part(requests);
  const size_t per = (requests.size() + parts - 1) / parts;
  std::vector<std::vector<Result<BlockRef>>> got(parts);
  std::vector<WorkerPool::Task> others;
  for (size_t k = 1; k < parts && k * per < requests.size(); ++k) {
    const auto part = requests.subspan(k * per, std::min(per, requests.size() - k * per));
    others.push_back(WorkerPool::shared().submit([this, part, &slot = got[k]] { slot = read_part(part); }));
  }
  got[0] = read_part(requests.first(per));
  for (WorkerPool::Task& t : others) t.join();
  std::vector<Result<BlockRef>> out = std::move(got[0]);
  out.reserve(requests.size());
  for (size_t k = 1; k < got.size(); ++k) {
    for (auto& r : got[k]) out.push_back(std::move(r));
  }
  return out;
}

std::vector<Result<BlockRef>> SsdReader::read_part(std::span<const BlockRequest> requests) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Result<BlockRef>> out;
  out.reserve(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) out.emplace_back(not_found("ssd tier: not held"));
  state_.metrics.reads.inc(requests.size());

  std::vector<BlockHash> hashes;
  for (const BlockRequest& r : requests) hashes.push_back(r.hash);
  auto entries = state_.index->multi_get(hashes);

  std::vector<Pending> pending;
  for (size_t i = 0; i < requests.size(); ++i) {
    if (!entries[i].ok()) {
      state_.metrics.corrupt_index_value.inc();
      (void)state_.remove_undecodable(requests[i].hash);
      state_.corrupt_log.error("ssd tier: quarantined index entry of block {}: {}",
                               requests[i].hash.hex(), entries[i].status().message());
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
    pending.push_back({i, e, std::move(file), AlignedBuffer(), 0, 0});
  }

  if (!pending.empty()) {
    // Records that lie back to back on disk are read as one op and split after: a prefix of small
    // blocks (16 KiB each for a small model) becomes a few large reads, not one per block.
    std::vector<size_t> order(pending.size());
    for (size_t k = 0; k < order.size(); ++k) order[k] = k;
    std::sort(order.begin(), order.end(), [&](size_t x, size_t y) {
      return std::pair(pending[x].entry.segment, pending[x].entry.offset) <
             std::pair(pending[y].entry.segment, pending[y].entry.offset);
    });
    std::vector<ReadRun> runs = plan_runs(pending, order);
    thread_local BlockCodec codec;
    std::vector<BlockHash> served;  // marked read together, after the batch
    served.reserve(pending.size());
    // Each record is verified as soon as its bytes are in, while the rest are still being read.
    auto settle = [&](Pending& p) {
      p.settled = true;
      const BlockRequest& req = requests[p.request];
      if (p.error) {
        quarantine(req.hash, p.entry, state_.metrics.corrupt_io, errno_status("read", p.error).message());
        return;
      }
      if (p.done < p.entry.length) {
        quarantine(req.hash, p.entry, state_.metrics.corrupt_out_of_bounds,
                   "segment ends " + std::to_string(p.entry.length - p.done) + " bytes before the record does");
        return;
      }
      state_.metrics.read_bytes.inc(p.done);
      RecordCheck check = check_record(std::move(p.buffer), p.entry, req, *state_.layouts, codec);
      if (check.fault != RecordFault::kNone) {
        Counter& reason = check.fault == RecordFault::kChecksum ? state_.metrics.corrupt_checksum
                          : check.fault == RecordFault::kDecode ? state_.metrics.corrupt_decode
                                                                : state_.metrics.corrupt_identity;
        quarantine(req.hash, p.entry, reason, check.why);
        return;
      }
      served.push_back(req.hash);
      state_.traffic.read(p.entry.namespace_id, p.done);
      out[p.request] = BlockRef(std::make_shared<const Block>(std::move(*check.block)));
    };
    auto lease_or = lease();
    Status ring_status = lease_or.ok() ? run_runs((*lease_or)->ring(), pending, runs, settle) : lease_or.status();
    state_.reads.mark_all(served);
    state_.outcomes.read(served);
    for (Pending& p : pending) {
      // The ring failed, not the record: no quarantine.
      if (!p.settled) out[p.request] = ring_status.ok() ? internal_error("ssd tier: read not completed") : ring_status;
    }
  }
  for (const auto& r : out) {
    if (r.ok()) state_.metrics.read_hits.inc();
    else state_.metrics.read_misses.inc();
  }
  state_.metrics.read_batch_seconds.observe(seconds_since(t0));
  return out;
}

}  // namespace kvtier
