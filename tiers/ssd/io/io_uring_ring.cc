#include "tiers/ssd/io/io_uring_ring.h"

#include <cerrno>
#include <cstring>
#include <deque>

#include "tiers/ssd/io/io_fault_seam.h"

namespace kvtier {

Result<std::unique_ptr<IoUringRing>> IoUringRing::create(unsigned depth) {
  std::unique_ptr<IoUringRing> r(new IoUringRing());
  const int rc = io_uring_queue_init(depth, &r->ring_, 0);
  if (rc < 0) return errno_status("io_uring_queue_init(" + std::to_string(depth) + ")", -rc);
  r->depth_ = depth;
  return r;
}

IoUringRing::~IoUringRing() {
  if (depth_) io_uring_queue_exit(&ring_);
}

namespace {

// The pieces of a vectored read still to fill after `done` bytes (a short transfer resumes there).
std::vector<iovec> pieces_after(const std::vector<iovec>& pieces, uint64_t done) {
  std::vector<iovec> rest;
  for (const iovec& v : pieces) {
    if (done >= v.iov_len) {
      done -= v.iov_len;
      continue;
    }
    rest.push_back({static_cast<uint8_t*>(v.iov_base) + done, v.iov_len - done});
    done = 0;
  }
  return rest;
}

void prepare(io_uring_sqe* sqe, IoOp& op, std::vector<iovec>& vectored, size_t index) {
  switch (op.kind) {
    case IoOp::Kind::kRead:
      if (!op.pieces.empty()) {
        vectored = op.done == 0 ? op.pieces : pieces_after(op.pieces, op.done);
        io_uring_prep_readv(sqe, op.fd, vectored.data(), static_cast<unsigned>(vectored.size()), op.offset + op.done);
        break;
      }
      io_uring_prep_read(sqe, op.fd, op.buffer + op.done, static_cast<unsigned>(op.length - op.done),
                         op.offset + op.done);
      break;
    case IoOp::Kind::kWrite:
      io_uring_prep_write(sqe, op.fd, op.buffer + op.done,
                          static_cast<unsigned>(op.length - op.done), op.offset + op.done);
      break;
    case IoOp::Kind::kDataSync:
      io_uring_prep_fsync(sqe, op.fd, IORING_FSYNC_DATASYNC);
      break;
  }
  io_uring_sqe_set_data64(sqe, index);
}

}  // namespace

Status run_io_batch(IoUringRing& ring, std::span<IoOp> ops, const std::function<void(size_t)>& on_done) {
  std::vector<size_t> finished;  // ops complete since on_done last ran
  std::deque<size_t> todo;
  // The iovec arrays of vectored reads in flight: the kernel reads them until the op completes.
  std::vector<std::vector<iovec>> vectored(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    ops[i].done = 0;
    ops[i].error = 0;
    todo.push_back(i);
  }
  size_t in_flight = 0;
  while (!todo.empty() || in_flight > 0) {
    // Fill the submission queue, then submit the whole wave at once.
    size_t queued = 0;
    while (!todo.empty() && in_flight + queued < ring.depth()) {
      io_uring_sqe* sqe = io_uring_get_sqe(ring.get());
      if (sqe == nullptr) break;
      prepare(sqe, ops[todo.front()], vectored[todo.front()], todo.front());
      todo.pop_front();
      ++queued;
    }
    if (queued > 0) {
      int rc;
      do {
        rc = io_uring_submit(ring.get());
      } while (rc == -EINTR || rc == -EAGAIN);
      if (rc < 0) return errno_status("io_uring_submit", -rc);
      in_flight += queued;
    }
    if (on_done) {
      for (size_t i : finished) on_done(i);
    }
    finished.clear();
    if (in_flight == 0) break;  // the last ops finished in the previous drain
    io_uring_cqe* cqe = nullptr;
    int rc;
    do {
      rc = io_uring_wait_cqe(ring.get(), &cqe);
    } while (rc == -EINTR);
    if (rc < 0) return errno_status("io_uring_wait_cqe", -rc);
    // Drain every completion that is ready.
    do {
      const size_t i = static_cast<size_t>(io_uring_cqe_get_data64(cqe));
      IoOp& op = ops[i];
      const IoSite site = op.kind == IoOp::Kind::kRead    ? IoSite::kRead
                          : op.kind == IoOp::Kind::kWrite ? IoSite::kWrite
                                                          : IoSite::kDataSync;
      const int res = io_result(site, op.fd, op.offset + op.done, op.length - op.done, cqe->res);
      io_uring_cqe_seen(ring.get(), cqe);
      --in_flight;
      if (res == -EAGAIN || res == -EINTR) {
        todo.push_back(i);  // transient: issue again
      } else if (res < 0) {
        op.error = -res;
        finished.push_back(i);
      } else if (op.kind == IoOp::Kind::kDataSync) {
        finished.push_back(i);
      } else {
        op.done += static_cast<uint64_t>(res);
        if (op.done < op.length && res != 0) {
          todo.push_back(i);  // short transfer: continue where it stopped
        } else {
          // A write that makes no progress failed; a read that does reached end of file.
          if (op.done < op.length && op.kind == IoOp::Kind::kWrite) op.error = EIO;
          finished.push_back(i);
        }
      }
    } while (io_uring_peek_cqe(ring.get(), &cqe) == 0 && cqe != nullptr);
  }
  if (on_done) {
    for (size_t i : finished) on_done(i);
  }
  return ok_status();
}

}  // namespace kvtier
