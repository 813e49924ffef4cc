// IoUringRing and run_io_batch: the only code that talks to io_uring. A batch of reads, writes
// and fdatasyncs is submitted with one io_uring_submit per wave (up to the ring's depth), and
// every completion is seen to the end: short transfers are continued, EAGAIN and EINTR retried,
// and any other error is recorded on its operation (never dropped, never fatal to the batch).
#pragma once

#include <liburing.h>
#include <sys/uio.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "base/status.h"

namespace kvtier {

// Owns one io_uring instance. Not thread-safe: one thread uses a ring at a time.
class IoUringRing {
 public:
  static Result<std::unique_ptr<IoUringRing>> create(unsigned depth);
  ~IoUringRing();
  IoUringRing(const IoUringRing&) = delete;
  IoUringRing& operator=(const IoUringRing&) = delete;

  io_uring* get() { return &ring_; }
  unsigned depth() const { return depth_; }

 private:
  IoUringRing() = default;
  io_uring ring_{};
  unsigned depth_ = 0;
};

struct IoOp {
  enum class Kind { kRead, kWrite, kDataSync };
  Kind kind = Kind::kRead;
  int fd = -1;
  uint8_t* buffer = nullptr;  // aligned for O_DIRECT
  uint64_t length = 0;
  uint64_t offset = 0;
  // A read into several buffers, in order (`buffer` unused; `length` their total): adjacent
  // records read by one op, each into the buffer its block keeps. Each piece aligned for O_DIRECT.
  std::vector<iovec> pieces;
  // Results: bytes transferred and the first error (0 = none; a positive errno otherwise).
  // A read that reaches end of file before `length` finishes with done < length, error 0.
  uint64_t done = 0;
  int error = 0;

  // A read of `length` bytes at `offset` into one buffer.
  static IoOp read(int fd, uint8_t* buffer, uint64_t length, uint64_t offset) {
    IoOp op;
    op.fd = fd;
    op.buffer = buffer;
    op.length = length;
    op.offset = offset;
    return op;
  }
};

// Runs every op to completion (success, error, or EOF for reads). Returns a non-ok status only
// when the ring itself fails (submission or wait errors); per-op errors are in the ops.
// `on_done(i)`, when given, runs once for each op as soon as it has finished, on the calling
// thread, after the ring has been refilled: work on one op's bytes overlaps the reads still in
// flight. (After a ring failure, ops not yet reported are never reported.)
Status run_io_batch(IoUringRing& ring, std::span<IoOp> ops,
                    const std::function<void(size_t)>& on_done = nullptr);

}  // namespace kvtier
