#include "inprocess/cuda/cuda_host_pinning.h"

#include <map>
#include <mutex>

#include <spdlog/spdlog.h>

#include "base/memory/large_buffer_cache.h"

namespace kvtier::cuda {

struct CudaHostPinning::State {
  mutable std::mutex mu;  // guards everything below
  size_t users = 0;
  const CudaDriver* driver = nullptr;
  std::map<const uint8_t*, bool> chunks;  // by base: registered (true) or failed (false, not retried)
  size_t registered_bytes = 0;
  size_t failures = 0;
};

CudaHostPinning& CudaHostPinning::instance() {
  static CudaHostPinning pinning;
  return pinning;
}

CudaHostPinning::State& CudaHostPinning::state() const {
  static State s;
  return s;
}

void CudaHostPinning::join() {
  State& s = state();
  std::lock_guard lock(s.mu);
  ++s.users;
}

void CudaHostPinning::leave() {
  State& s = state();
  std::lock_guard lock(s.mu);
  if (s.users == 0 || --s.users > 0) return;
  for (const auto& [base, registered] : s.chunks) {
    if (!registered) continue;
    // Unregistering needs no current context; a failure here leaves the pages locked until the
    // process ends, which is only memory the OS cannot page out.
    if (Status st = s.driver->check(s.driver->cuMemHostUnregister(const_cast<uint8_t*>(base)), "cuMemHostUnregister");
        !st.ok()) {
      spdlog::warn("cuda: could not unregister a host chunk: {}", st.message());
    }
    large_buffer_unhold_chunk(base);
  }
  s.chunks.clear();
  s.registered_bytes = 0;
}

bool CudaHostPinning::pin(const CudaDriver& driver, const void* p, size_t bytes) {
  const LargeBufferChunk chunk = large_buffer_chunk(p);
  if (chunk.base == nullptr) return false;
  if (static_cast<const uint8_t*>(p) + bytes > chunk.base + chunk.bytes) return false;
  State& s = state();
  std::lock_guard lock(s.mu);
  auto it = s.chunks.find(chunk.base);
  if (it != s.chunks.end()) return it->second;
  s.driver = &driver;
  // Held first, so the chunk cannot be unmapped (or its pages dropped) while it is registered.
  large_buffer_hold_chunk(chunk.base);
  const Status st = driver.check(
      driver.cuMemHostRegister(const_cast<uint8_t*>(chunk.base), chunk.bytes, CudaDriver::kHostRegisterPortable),
      "cuMemHostRegister");
  if (!st.ok()) {
    large_buffer_unhold_chunk(chunk.base);
    ++s.failures;
    spdlog::warn("cuda: host chunk of {} bytes not page-locked, its copies go through the driver's bounce "
                 "buffer: {}", chunk.bytes, st.message());
    s.chunks.emplace(chunk.base, false);
    return false;
  }
  s.chunks.emplace(chunk.base, true);
  s.registered_bytes += chunk.bytes;
  return true;
}

size_t CudaHostPinning::registered_bytes() const {
  State& s = state();
  std::lock_guard lock(s.mu);
  return s.registered_bytes;
}

size_t CudaHostPinning::failed_registrations() const {
  State& s = state();
  std::lock_guard lock(s.mu);
  return s.failures;
}

}  // namespace kvtier::cuda
