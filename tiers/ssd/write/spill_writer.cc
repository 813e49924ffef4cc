#include "tiers/ssd/write/spill_writer.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "base/byte_size.h"
#include "base/elapsed.h"
#include "serialize/format/checksum.h"
#include "tiers/ssd/io/io_fault_seam.h"

namespace kvtier {

SpillWriter::SpillWriter(SsdState& state, SpillQueue& queue, StillWanted still_wanted, Done done)
    : state_(state),
      queue_(queue),
      still_wanted_(std::move(still_wanted)),
      done_(std::move(done)),
      framer_(state.options.codec),
      segments_(state, {.drain = [this] { drain(); },
                        .reinsert = [this](SpillItemPtr item) { reinsert(std::move(item)); },
                        .reclaimed = [this](uint64_t segment) { failed_sync_.erase(segment); }}) {
  // Sequence numbers only need to grow across restarts: start from the clock.
  next_seq_ = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                        std::chrono::system_clock::now().time_since_epoch())
                                        .count());
}

SpillWriter::~SpillWriter() {
  if (thread_.joinable()) {
    queue_.close();
    stop(std::chrono::steady_clock::now());
  }
}

Status SpillWriter::start() {
  KVTIER_ASSIGN_OR_RETURN(ring_, IoUringRing::create(std::max(64u, state_.options.writer_queue_depth)));
  KVTIER_RETURN_IF_ERROR(segments_.start(*ring_));
  thread_ = std::thread([this] { run(); });
  return ok_status();
}

size_t SpillWriter::stop(std::chrono::steady_clock::time_point deadline) {
  deadline_.store(deadline.time_since_epoch().count());
  if (thread_.joinable()) thread_.join();
  // Whatever the thread did not reach is dropped, counted and reported once.
  size_t dropped = 0;
  uint64_t bytes = 0;
  while (true) {
    auto rest = queue_.pop_batch(1024, ~0ull, std::chrono::milliseconds(0));
    if (rest.empty()) break;
    for (auto& item : rest) {
      ++dropped;
      bytes += item->charged_bytes;
      queue_.release(item->charged_bytes);
      state_.metrics.spill_dropped_shutdown.inc();
    }
    if (done_) done_(rest);
  }
  if (dropped) {
    spdlog::warn("ssd tier: {} blocks ({}) were still queued when the drain time ran out; "
                 "not written", dropped, format_byte_size(bytes));
  }
  {
    std::lock_guard lock(done_mu_);
    finished_ = true;
  }
  done_cv_.notify_all();
  return dropped;
}

void SpillWriter::wait_for(uint64_t ticket) {
  std::unique_lock lock(done_mu_);
  done_cv_.wait(lock, [&] {
    return (completed_ >= ticket && reinserts_outstanding_ == 0) || finished_;
  });
}

void SpillWriter::fail(const SpillItem& item, const Status& why) {
  if (why.code() == StatusCode::kNoSpace) state_.metrics.spill_failed_no_space.inc();
  else state_.metrics.spill_failed_io.inc();
  if (item.preframed) state_.metrics.reinsert_failed.inc();
  state_.write_fail_log.error("ssd tier: block {} not written: {}", item.hash.hex(),
                              why.to_string());
}

void SpillWriter::reinsert(SpillItemPtr item) {
  reinserts_.push_back(std::move(item));
  std::lock_guard lock(done_mu_);
  ++reinserts_outstanding_;
}

void SpillWriter::seal(uint64_t segment, const Status& why) {
  if (!segments_.seal(segment)) return;  // already sealed, or rotated away
  state_.metrics.segments_sealed.inc();
  spdlog::error("ssd tier: sealed segment {} after {}; new records go to a fresh segment", segment,
                why.to_string());
}

// --- The loop ------------------------------------------------------------------------------------

void SpillWriter::run() {
  name_this_thread("spill-writer");
  const uint64_t budget = std::max<uint64_t>(state_.options.max_batch_bytes, 8 << 20);
  const size_t max_items = std::max<size_t>(1, std::min<size_t>(state_.options.max_batch_items,
                                                                ring_->depth() / 2));
  // Groups whose writes or syncs may be in flight at once (SsdTierOptions says what was measured).
  const size_t max_groups = std::max<size_t>(1, state_.options.writer_groups_in_flight);
  while (true) {
    const auto deadline = deadline_.load();
    const bool stopping =
        deadline != 0 && std::chrono::steady_clock::now().time_since_epoch().count() > deadline;
    bool took = false;
    if (!stopping && inflight_bytes_ < budget && groups_.size() < max_groups) {
      std::vector<SpillItemPtr> items;
      while (!reinserts_.empty() && items.size() < max_items) {
        items.push_back(std::move(reinserts_.front()));
        reinserts_.pop_front();
      }
      // Block on the queue only when nothing is in flight; otherwise just look.
      auto more = queue_.pop_batch(max_items - items.size(), budget - inflight_bytes_,
                                   groups_.empty() && items.empty() ? std::chrono::milliseconds(100)
                                                                    : std::chrono::milliseconds(0));
      for (auto& m : more) items.push_back(std::move(m));
      if (!items.empty()) {
        start_group(std::move(items));
        took = true;
      }
    }
    if (groups_.empty()) {
      if (stopping || (queue_.closed() && queue_.queued_items() == 0 && reinserts_.empty())) break;
      continue;
    }
    // Wait for completions unless there is more to start right away.
    advance();
    reap(/*wait=*/!took || inflight_bytes_ >= budget || groups_.size() >= max_groups);
    advance();
  }
  drain();
}

void SpillWriter::start_group(std::vector<SpillItemPtr> items) {
  size_t i = 0;
  while (i < items.size()) {
    segments_.next_lane();
    auto g = std::make_unique<Group>();
    g->started = std::chrono::steady_clock::now();
    g->records.reserve(items.size() - i);
    for (; i < items.size(); ++i) {
      Record r;
      r.item = items[i];
      if (!frame(r)) {
        g->records.push_back(std::move(r));
        continue;
      }
      const uint64_t size = record_padded(r.item->frame_size);
      // A rotation may reclaim and must find nothing unsubmitted: close this group first.
      if (!segments_.fits(size) && !g->records.empty()) break;
      Result<SegmentAllocator::Place> place = segments_.place(size);
      if (!place.ok()) {
        fail(*r.item, place.status());
      } else {
        r.segment = place->segment;
        r.offset = place->offset;
        r.ok = true;
        g->bytes += size;
      }
      g->records.push_back(std::move(r));
    }
    Group& group = *g;
    groups_.push_back(std::move(g));
    inflight_bytes_ += group.bytes;
    for (size_t k = 0; k < group.records.size(); ++k) {
      Record& r = group.records[k];
      if (!r.ok) continue;
      r.write.kind = Op::Kind::kWrite;
      r.write.group = &group;
      r.write.record = k;
      r.write.fd = state_.segments.file(r.segment) ? state_.segments.file(r.segment)->fd() : -1;
      r.write.buffer = r.compressed.empty() ? r.item->buffer.data() : r.compressed.data();
      r.write.length = record_padded(r.item->frame_size);
      r.write.offset = r.offset;
      ++group.writes_outstanding;
      submit_write(r.write);
    }
  }
}

bool SpillWriter::frame(Record& r) {
  Result<FramedRecord> framed = framer_.frame(*r.item);
  if (!framed.ok()) {
    fail(*r.item, framed.status());
    return false;
  }
  r.header = framed->header;
  r.compressed = std::move(framed->compressed);
  return true;
}

// --- io_uring ----------------------------------------------------------------------------------

namespace {
io_uring_sqe* next_sqe(IoUringRing& ring, unsigned& unsubmitted, size_t& inflight) {
  io_uring_sqe* sqe = io_uring_get_sqe(ring.get());
  while (sqe == nullptr) {  // submission queue full: hand what is there to the kernel
    int rc = io_uring_submit(ring.get());
    if (rc > 0) unsubmitted = 0;
    sqe = io_uring_get_sqe(ring.get());
  }
  ++unsubmitted;
  ++inflight;
  return sqe;
}
}  // namespace

void SpillWriter::submit_write(Op& op) {
  io_uring_sqe* sqe = next_sqe(*ring_, unsubmitted_, inflight_ops_);
  io_uring_prep_write(sqe, op.fd, op.buffer + op.done, static_cast<unsigned>(op.length - op.done),
                      op.offset + op.done);
  io_uring_sqe_set_data(sqe, &op);
}

void SpillWriter::submit_syncs(Group& g) {
  g.sync_submitted = true;
  for (const auto& [id, file] : g.segments) {
    auto op = std::make_unique<Op>();
    op->kind = Op::Kind::kSync;
    op->group = &g;
    op->segment = id;
    op->fd = file->fd();
    io_uring_sqe* sqe = next_sqe(*ring_, unsubmitted_, inflight_ops_);
    io_uring_prep_fsync(sqe, op->fd, IORING_FSYNC_DATASYNC);
    io_uring_sqe_set_data(sqe, op.get());
    g.syncs.push_back(std::move(op));
    ++g.syncs_outstanding;
  }
}

void SpillWriter::reap(bool wait) {
  while (unsubmitted_ > 0) {
    const int rc = io_uring_submit(ring_->get());
    if (rc >= 0) {
      unsubmitted_ = 0;
      break;
    }
    if (rc == -EINTR || rc == -EAGAIN || rc == -EBUSY) continue;
    state_.write_fail_log.error("ssd tier: io_uring_submit: {}; retrying", std::strerror(-rc));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  io_uring_cqe* cqe = nullptr;
  if (wait && inflight_ops_ > 0) {
    int rc;
    do {
      rc = io_uring_wait_cqe(ring_->get(), &cqe);
    } while (rc == -EINTR);
    if (rc < 0) return;
  } else if (io_uring_peek_cqe(ring_->get(), &cqe) != 0 || cqe == nullptr) {
    return;
  }
  do {
    Op* op = static_cast<Op*>(io_uring_cqe_get_data(cqe));
    const int res = op->kind == Op::Kind::kWrite
                        ? io_result(IoSite::kWrite, op->fd, op->offset + op->done, op->length - op->done, cqe->res)
                        : io_result(IoSite::kDataSync, op->fd, 0, 0, cqe->res);
    io_uring_cqe_seen(ring_->get(), cqe);
    --inflight_ops_;
    on_complete(*op, res);
  } while (io_uring_peek_cqe(ring_->get(), &cqe) == 0 && cqe != nullptr);
}

void SpillWriter::on_complete(Op& op, int res) {
  Group& g = *op.group;
  if (res == -EAGAIN || res == -EINTR) {  // transient: issue again
    if (op.kind == Op::Kind::kWrite) {
      submit_write(op);
    } else {
      io_uring_sqe* sqe = next_sqe(*ring_, unsubmitted_, inflight_ops_);
      io_uring_prep_fsync(sqe, op.fd, IORING_FSYNC_DATASYNC);
      io_uring_sqe_set_data(sqe, &op);
    }
    return;
  }
  if (op.kind == Op::Kind::kWrite) {
    Record& r = g.records[op.record];
    if (res > 0) op.done += static_cast<uint64_t>(res);
    if (res > 0 && op.done < op.length) {
      submit_write(op);  // short write: continue where it stopped
      return;
    }
    if (res < 0 || op.done < op.length) {
      r.ok = false;
      const Status why = errno_status("write segment " + std::to_string(r.segment) + " offset " +
                                          std::to_string(r.offset),
                                      res < 0 ? -res : EIO);
      fail(*r.item, why);
      seal(r.segment, why);
    } else {
      g.segments[r.segment] = state_.segments.file(r.segment);
    }
    --g.writes_outstanding;
    return;
  }
  // A sync: if it failed, nothing written to that segment by this group is known durable.
  if (res < 0) {
    const Status why = errno_status("fdatasync segment " + std::to_string(op.segment), -res);
    failed_sync_[op.segment] = -res;
    seal(op.segment, why);
  }
  --g.syncs_outstanding;
}

void SpillWriter::advance() {
  for (auto& g : groups_) {
    if (g->writes_outstanding == 0 && !g->sync_submitted) {
      g->segments.erase(0);  // a segment gone meanwhile leaves a null file
      submit_syncs(*g);
    }
  }
  while (!groups_.empty() && groups_.front()->sync_submitted &&
         groups_.front()->syncs_outstanding == 0) {
    commit(*groups_.front());
    finish(*groups_.front());
    groups_.pop_front();
  }
}

void SpillWriter::drain() {
  while (!groups_.empty()) {
    advance();
    if (groups_.empty()) break;
    reap(/*wait=*/true);
  }
  reap(/*wait=*/false);  // submit anything still queued (there should be nothing)
}

// --- Commit ------------------------------------------------------------------------------------

void SpillWriter::commit(Group& g) {
  std::lock_guard lock(state_.index_mu);
  std::vector<DurableRecord> durable;
  std::vector<size_t> at;  // durable[k] is g.records[at[k]]
  for (size_t i = 0; i < g.records.size(); ++i) {
    Record& r = g.records[i];
    if (auto bad = failed_sync_.find(r.segment); r.ok && bad != failed_sync_.end()) {
      r.ok = false;
      fail(*r.item, errno_status("fdatasync segment " + std::to_string(r.segment), bad->second));
    }
    if (!r.ok) continue;
    if (still_wanted_ && !r.item->preframed && !still_wanted_(*r.item)) continue;  // erased meanwhile
    durable.push_back({r.item.get(), r.segment, r.offset, r.header.payload_checksum});
    at.push_back(i);
  }
  const IndexCommitResult result = commit_durable_records(state_, durable, next_seq_);
  if (!result.status.ok()) {
    for (size_t k : result.committed) {
      state_.metrics.spill_failed_index.inc();
      g.records[at[k]].ok = false;
    }
    state_.write_fail_log.error("ssd tier: index commit of {} blocks failed: {}", result.committed.size(),
                                result.status.to_string());
  }
}

void SpillWriter::finish(Group& g) {
  state_.metrics.write_batches.inc();
  state_.metrics.write_batch_seconds.observe(seconds_since(g.started));
  inflight_bytes_ -= g.bytes;
  state_.refresh_space_gauges();
  std::vector<SpillItemPtr> items;
  uint64_t max_ticket = 0;
  size_t moved = 0;
  for (Record& r : g.records) {
    queue_.release(r.item->charged_bytes);
    max_ticket = std::max(max_ticket, r.item->ticket);
    moved += r.item->preframed;
    items.push_back(r.item);
  }
  state_.metrics.queue_bytes.set(static_cast<int64_t>(queue_.charged_bytes()));
  if (done_) done_(items);
  bool moves_in_flight = false;
  {
    std::lock_guard lock(done_mu_);
    completed_ = std::max(completed_, max_ticket);
    reinserts_outstanding_ -= moved;
    moves_in_flight = reinserts_outstanding_ > 0;
  }
  // Forgotten only when no moved block is queued or in a group still to commit: an empty queue of
  // moves is not enough, since a newer group may carry them (a DELETE then came back to life).
  if (!moves_in_flight) state_.erased_during_reinsert.clear();
  done_cv_.notify_all();
}

}  // namespace kvtier
