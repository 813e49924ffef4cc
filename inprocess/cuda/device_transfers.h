// DeviceTransfers: one EmbeddedCache's copies between its host blocks and an engine's CUDA memory.
// Uploads are asynchronous on the caller's stream: the blocks they read from are kept alive until
// an event recorded after them has passed, so a block evicted meanwhile is not freed under a DMA.
// Downloads land in fresh blocks and are waited for before the blocks are published.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

#include "base/metrics/metrics.h"
#include "base/status.h"
#include "inprocess/cuda/cuda_driver.h"
#include "tiers/tier.h"

namespace kvtier::cuda {

struct DeviceTransferMetrics {
  Counter bytes_to_device;
  Counter bytes_from_device;
  Counter unpinned_copies;  // host bytes outside a page-locked chunk: bounce-buffered, synchronous
  Counter copies;           // DMA calls (blocks side by side merged into one)
};

// Thread-safe.
class DeviceTransfers {
 public:
  // Loads the CUDA driver; unavailable() when there is none.
  static Result<std::unique_ptr<DeviceTransfers>> create();
  // Waits for every upload in flight, then lets the host chunks be unregistered.
  ~DeviceTransfers();
  DeviceTransfers(const DeviceTransfers&) = delete;
  DeviceTransfers& operator=(const DeviceTransfers&) = delete;

  const CudaDriver& driver() const { return *driver_; }
  // The device's context, current on this thread for the scope; every call below needs it. The
  // first also starts page-locking host chunks ahead of their copies (CudaHostPinning::start).
  Result<ScopedDeviceContext> enter(int device) const;

  // Enqueues a copy of `src` to device address `dst` on `stream`. `src` must stay valid until
  // retire_after() has been called for this stream and its event has passed.
  Status upload(CUstream stream, std::span<const uint8_t> src, CUdeviceptr dst);
  // Keeps `held` alive until the work enqueued on `stream` so far has completed.
  Status retire_after(CUstream stream, std::vector<BlockRef> held);
  // True when a kernel on the device may read [p, p + bytes) in place: it lies in a chunk that is
  // page-locked and mapped (waiting for its registration if it is queued).
  bool mapped(const uint8_t* p, size_t bytes) const;
  // Bytes the engine's kernels read in place, moved to the device as much as a copy's.
  void count_read_in_place(size_t bytes) { metrics_.bytes_to_device.inc(bytes); }
  // Enqueues a copy of device `src` into `dst` on `stream` (wait with synchronize()).
  Status download(CUstream stream, CUdeviceptr src, std::span<uint8_t> dst);
  Status synchronize(CUstream stream);

  // The work enqueued on a stream up to a point: wait() blocks until it has run.
  class Mark {
   public:
    Mark(const CudaDriver* driver, CUevent event) : driver_(driver), event_(event) {}
    Mark(Mark&& other) noexcept : driver_(other.driver_), event_(std::exchange(other.event_, nullptr)) {}
    Mark(const Mark&) = delete;
    Mark& operator=(const Mark&) = delete;
    Mark& operator=(Mark&& other) noexcept {
      std::swap(driver_, other.driver_);
      std::swap(event_, other.event_);
      return *this;
    }
    ~Mark();
    Status wait() const;

   private:
    const CudaDriver* driver_;
    CUevent event_;
  };
  Result<Mark> mark(CUstream stream);

  const DeviceTransferMetrics& metrics() const { return metrics_; }
  size_t uploads_in_flight() const;

 private:
  explicit DeviceTransfers(const CudaDriver* driver);
  // Frees what retired uploads held. With `wait`, waits for all of them first.
  void reap(bool wait);

  struct InFlight {
    CUevent event = nullptr;
    std::vector<BlockRef> held;
  };
  const CudaDriver* driver_;
  DeviceTransferMetrics metrics_;
  mutable std::mutex mu_;  // guards in_flight_
  std::deque<InFlight> in_flight_;
};

// Copies of consecutive blocks, merged where a block lies right after the previous one both in
// host memory (in the same chunk) and on the device: fewer, larger DMAs, each with less of the
// copy engine's fixed cost. Not thread-safe; flush() before anything that must see the copies
// enqueued (an event, a hook, a synchronize).
class CopyRun {
 public:
  CopyRun(DeviceTransfers& transfers, CUstream stream, bool to_device)
      : transfers_(transfers), stream_(stream), to_device_(to_device) {}
  Status add(uint8_t* host, CUdeviceptr device, size_t bytes);
  Status flush();

 private:
  DeviceTransfers& transfers_;
  CUstream stream_;
  bool to_device_;
  uint8_t* host_ = nullptr;
  const uint8_t* chunk_end_ =
      nullptr;  // the end of host_'s chunk (nullptr: not in one, never merged)
  CUdeviceptr device_ = 0;
  size_t bytes_ = 0;
};

}  // namespace kvtier::cuda
