#include "inprocess/cuda/cuda_host_pinning.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include <spdlog/spdlog.h>

#include "base/memory/large_buffer_cache.h"

namespace kvtier::cuda {

namespace {

enum class ChunkState { kQueued, kRegistered, kFailed };

}  // namespace

struct CudaHostPinning::State {
  mutable std::mutex mu;  // guards everything below
  std::condition_variable wake;
  std::condition_variable settled;  // a queued chunk was registered, failed or dropped
  size_t users = 0;
  const CudaDriver* driver = nullptr;
  int device = -1;
  std::map<const uint8_t*, ChunkState> chunks;  // by base; kFailed ones are not retried
  std::deque<LargeBufferChunk> queue;           // for the registering thread
  std::thread thread;
  bool stopping = false;
  size_t registered_bytes = 0;
  size_t failures = 0;
};

CudaHostPinning& CudaHostPinning::instance() {
  static CudaHostPinning pinning;
  return pinning;
}

CudaHostPinning::State& CudaHostPinning::state() const {
  // Never destroyed: a process that ends with a cache still open (a Python script that never
  // closed it) would otherwise destroy the registering thread while it runs, and std::thread's
  // destructor ends such a process with std::terminate (seen on the H200 host). At exit the
  // thread sleeps on `wake` and goes with the process.
  static State* s = new State;
  return *s;
}

namespace {

// Registers one chunk, held first so it cannot be unmapped (or its pages dropped) meanwhile.
// Returns false (logged) when the driver refused. Called without the registry's lock: the driver
// call waits for the device.
bool register_chunk(const CudaDriver& driver, const LargeBufferChunk& chunk) {
  large_buffer_hold_chunk(chunk.base);
  const Status st =
      driver.check(driver.cuMemHostRegister(
                       const_cast<uint8_t*>(chunk.base), chunk.bytes,
                       CudaDriver::kHostRegisterPortable | CudaDriver::kHostRegisterDeviceMap),
                   "cuMemHostRegister");
  if (!st.ok()) {
    large_buffer_unhold_chunk(chunk.base);
    spdlog::warn(
        "cuda: host chunk of {} bytes not page-locked, its copies go through the driver's bounce "
        "buffer: {}",
        chunk.bytes, st.message());
    return false;
  }
  return true;
}

}  // namespace

// The registry's state is a function-local static so that the chunk listener, a plain function,
// can reach it.
void CudaHostPinning::enqueue(LargeBufferChunk chunk) {
  State& s = instance().state();
  {
    std::lock_guard lock(s.mu);
    if (s.stopping || !s.thread.joinable()) return;
    if (!s.chunks.emplace(chunk.base, ChunkState::kQueued).second) return;
    s.queue.push_back(chunk);
  }
  s.wake.notify_one();
}

void CudaHostPinning::join() {
  State& s = state();
  std::lock_guard lock(s.mu);
  ++s.users;
}

void CudaHostPinning::leave() {
  State& s = state();
  std::thread thread;
  {
    std::lock_guard lock(s.mu);
    if (s.users == 0 || --s.users > 0) return;
    set_large_buffer_chunk_listener(nullptr);
    s.stopping = true;
    thread = std::move(s.thread);
  }
  s.wake.notify_all();
  s.settled.notify_all();
  if (thread.joinable()) thread.join();
  std::lock_guard lock(s.mu);
  for (const auto& [base, st] : s.chunks) {
    if (st != ChunkState::kRegistered) continue;
    // Unregistering needs no current context; a failure here leaves the pages locked until the
    // process ends, which is only memory the OS cannot page out.
    if (Status r = s.driver->check(s.driver->cuMemHostUnregister(const_cast<uint8_t*>(base)),
                                   "cuMemHostUnregister");
        !r.ok()) {
      spdlog::warn("cuda: could not unregister a host chunk: {}", r.message());
    }
    large_buffer_unhold_chunk(base);
  }
  s.chunks.clear();
  s.queue.clear();
  s.registered_bytes = 0;
  s.stopping = false;
  s.device = -1;
}

void CudaHostPinning::start(const CudaDriver& driver, int device) {
  State& s = state();
  {
    std::lock_guard lock(s.mu);
    if (s.thread.joinable() || s.users == 0) return;
    s.driver = &driver;
    s.device = device;
    s.thread = std::thread([this] { run(); });
  }
  // The listener first, then the chunks mapped so far: a chunk mapped in between is seen twice
  // and queued once.
  set_large_buffer_chunk_listener(&CudaHostPinning::enqueue);
  for (const LargeBufferChunk& c : large_buffer_chunks()) enqueue(c);
}

void CudaHostPinning::run() {
  State& s = state();
  std::optional<ScopedDeviceContext> ctx;
  {
    std::lock_guard lock(s.mu);
    auto entered = ScopedDeviceContext::enter(*s.driver, s.device);
    if (entered.ok()) {
      ctx.emplace(std::move(entered).value());
    } else {
      spdlog::warn("cuda: host chunks are page-locked on first use instead of ahead of it: {}",
                   entered.status().message());
    }
  }
  std::unique_lock lock(s.mu);
  while (true) {
    s.wake.wait(lock, [&] { return s.stopping || !s.queue.empty(); });
    if (s.stopping) return;
    LargeBufferChunk queued = s.queue.front();
    s.queue.pop_front();
    if (!ctx) {  // no context here: pin() registers it when a copy comes
      s.chunks.erase(queued.base);
      s.settled.notify_all();
      continue;
    }
    lock.unlock();
    // Still a chunk, and held from here on: one unmapped since it was queued is not registered.
    large_buffer_hold_chunk(queued.base);
    const LargeBufferChunk now = large_buffer_chunk(queued.base);
    const bool mapped = now.base == queued.base;
    const bool ok = mapped && register_chunk(*s.driver, now);
    large_buffer_unhold_chunk(queued.base);  // register_chunk holds it again for the registration
    lock.lock();
    if (!mapped) {
      s.chunks.erase(queued.base);
    } else if (ok) {
      s.chunks[queued.base] = ChunkState::kRegistered;
      s.registered_bytes += now.bytes;
    } else {
      s.chunks[queued.base] = ChunkState::kFailed;
      ++s.failures;
    }
    s.settled.notify_all();
  }
}

void CudaHostPinning::wait_queued() const {
  State& s = state();
  std::unique_lock lock(s.mu);
  s.settled.wait(lock, [&] {
    if (s.stopping || !s.thread.joinable()) return true;
    return std::none_of(s.chunks.begin(), s.chunks.end(),
                        [](const auto& c) { return c.second == ChunkState::kQueued; });
  });
}

bool CudaHostPinning::pin(const CudaDriver& driver, const void* p, size_t bytes) {
  const LargeBufferChunk chunk = large_buffer_chunk(p);
  if (chunk.base == nullptr) return false;
  if (static_cast<const uint8_t*>(p) + bytes > chunk.base + chunk.bytes) return false;
  State& s = state();
  std::unique_lock lock(s.mu);
  // Queued for the registering thread: wait for it. The copy is on kvtier's thread, which waits
  // at most once per chunk (when the door starts, or a chunk was just mapped); a copy from
  // pageable memory instead would be synchronous and slower for every block of the chunk.
  s.settled.wait(lock, [&] {
    auto it = s.chunks.find(chunk.base);
    return s.stopping || it == s.chunks.end() || it->second != ChunkState::kQueued;
  });
  if (auto it = s.chunks.find(chunk.base); it != s.chunks.end())
    return it->second == ChunkState::kRegistered;
  if (s.thread.joinable()) {
    // Mapped before the listener was set and not enumerated yet (start() is between the two): the
    // registering thread will have it.
    return false;
  }
  s.driver = &driver;
  const bool ok = register_chunk(driver, chunk);
  s.chunks.emplace(chunk.base, ok ? ChunkState::kRegistered : ChunkState::kFailed);
  if (ok) {
    s.registered_bytes += chunk.bytes;
  } else {
    ++s.failures;
  }
  return ok;
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

size_t CudaHostPinning::queued_chunks() const {
  State& s = state();
  std::lock_guard lock(s.mu);
  return s.queue.size();
}

}  // namespace kvtier::cuda
