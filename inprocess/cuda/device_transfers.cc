#include "inprocess/cuda/device_transfers.h"

#include <utility>

#include <spdlog/spdlog.h>

#include "base/memory/large_buffer_cache.h"
#include "inprocess/cuda/cuda_host_pinning.h"

namespace kvtier::cuda {

Result<std::unique_ptr<DeviceTransfers>> DeviceTransfers::create() {
  KVTIER_ASSIGN_OR_RETURN(const CudaDriver* driver, CudaDriver::get());
  CudaHostPinning::instance().join();
  return std::unique_ptr<DeviceTransfers>(new DeviceTransfers(driver));
}

DeviceTransfers::DeviceTransfers(const CudaDriver* driver) : driver_(driver) {}

DeviceTransfers::~DeviceTransfers() {
  reap(/*wait=*/true);
  CudaHostPinning::instance().leave();
}

Result<ScopedDeviceContext> DeviceTransfers::enter(int device) const {
  KVTIER_ASSIGN_OR_RETURN(ScopedDeviceContext ctx, ScopedDeviceContext::enter(*driver_, device));
  CudaHostPinning::instance().start(*driver_, device);
  return ctx;
}

Status DeviceTransfers::upload(CUstream stream, std::span<const uint8_t> src, CUdeviceptr dst) {
  if (!CudaHostPinning::instance().pin(*driver_, src.data(), src.size())) metrics_.unpinned_copies.inc();
  KVTIER_RETURN_IF_ERROR(driver_->check(driver_->cuMemcpyHtoDAsync(dst, src.data(), src.size(), stream),
                                        "cuMemcpyHtoDAsync"));
  metrics_.bytes_to_device.inc(src.size());
  metrics_.copies.inc();
  return ok_status();
}

bool DeviceTransfers::mapped(const uint8_t* p, size_t bytes) const {
  return CudaHostPinning::instance().pin(*driver_, p, bytes);
}

Status DeviceTransfers::download(CUstream stream, CUdeviceptr src, std::span<uint8_t> dst) {
  if (!CudaHostPinning::instance().pin(*driver_, dst.data(), dst.size())) metrics_.unpinned_copies.inc();
  KVTIER_RETURN_IF_ERROR(driver_->check(driver_->cuMemcpyDtoHAsync(dst.data(), src, dst.size(), stream),
                                        "cuMemcpyDtoHAsync"));
  metrics_.bytes_from_device.inc(dst.size());
  metrics_.copies.inc();
  return ok_status();
}

Status DeviceTransfers::synchronize(CUstream stream) {
  return driver_->check(driver_->cuStreamSynchronize(stream), "cuStreamSynchronize");
}

Result<DeviceTransfers::Mark> DeviceTransfers::mark(CUstream stream) {
  CUevent event = nullptr;
  KVTIER_RETURN_IF_ERROR(driver_->check(driver_->cuEventCreate(&event, CudaDriver::kEventDisableTiming), "cuEventCreate"));
  Mark m(driver_, event);
  KVTIER_RETURN_IF_ERROR(driver_->check(driver_->cuEventRecord(event, stream), "cuEventRecord"));
  return m;
}

DeviceTransfers::Mark::~Mark() {
  if (event_ != nullptr) driver_->cuEventDestroy(event_);
}

Status DeviceTransfers::Mark::wait() const {
  return driver_->check(driver_->cuEventSynchronize(event_), "cuEventSynchronize");
}

Status DeviceTransfers::retire_after(CUstream stream, std::vector<BlockRef> held) {
  reap(/*wait=*/false);
  if (held.empty()) return ok_status();
  InFlight f;
  Status st = driver_->check(driver_->cuEventCreate(&f.event, CudaDriver::kEventDisableTiming), "cuEventCreate");
  if (st.ok()) st = driver_->check(driver_->cuEventRecord(f.event, stream), "cuEventRecord");
  if (!st.ok()) {
    // Without an event there is no telling when the copies are done: wait for the stream, so
    // the blocks are not freed under them.
    if (f.event != nullptr) driver_->cuEventDestroy(f.event);
    Status synced = synchronize(stream);
    return synced.ok() ? st : synced;
  }
  f.held = std::move(held);
  std::lock_guard lock(mu_);
  in_flight_.push_back(std::move(f));
  return ok_status();
}

void DeviceTransfers::reap(bool wait) {
  std::deque<InFlight> done;
  {
    std::lock_guard lock(mu_);
    while (!in_flight_.empty()) {
      InFlight& f = in_flight_.front();
      const CUresult r = wait ? driver_->cuEventSynchronize(f.event) : driver_->cuEventQuery(f.event);
      if (r == CudaDriver::kNotReady) break;
      if (r != CudaDriver::kSuccess) {
        // The context is broken (a fault in some kernel): the copies will never run, so holding
        // the blocks longer protects nothing.
        spdlog::error("cuda: waiting for uploads failed, releasing their blocks: {}",
                      driver_->check(r, wait ? "cuEventSynchronize" : "cuEventQuery").message());
      }
      done.push_back(std::move(f));
      in_flight_.pop_front();
    }
  }
  for (InFlight& f : done) driver_->cuEventDestroy(f.event);
}

size_t DeviceTransfers::uploads_in_flight() const {
  std::lock_guard lock(mu_);
  return in_flight_.size();
}

Status CopyRun::add(uint8_t* host, CUdeviceptr device, size_t bytes) {
  // One chunk, so the merged range is registered (or not) as one.
  if (bytes_ > 0 && host == host_ + bytes_ && device == device_ + bytes_ && chunk_end_ != nullptr &&
      host + bytes <= chunk_end_) {
    bytes_ += bytes;
    return ok_status();
  }
  KVTIER_RETURN_IF_ERROR(flush());
  // Looked up once per run, not per block.
  const LargeBufferChunk chunk = large_buffer_chunk(host);
  chunk_end_ = chunk.base == nullptr ? nullptr : chunk.base + chunk.bytes;
  host_ = host;
  device_ = device;
  bytes_ = bytes;
  return ok_status();
}

Status CopyRun::flush() {
  if (bytes_ == 0) return ok_status();
  const size_t bytes = std::exchange(bytes_, 0);
  if (to_device_) return transfers_.upload(stream_, {host_, bytes}, device_);
  return transfers_.download(stream_, device_, {host_, bytes});
}

}  // namespace kvtier::cuda
