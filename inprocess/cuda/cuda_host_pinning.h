// CudaHostPinning: page-locks the host memory kvtier's blocks live in, so a GPU copies them by DMA
// straight from where they lie (and into fresh blocks on a save) instead of through the driver's
// own bounce buffer. Blocks live in LargeBufferCache's chunks (base/memory/large_buffer_cache.h).
//
// cuMemHostRegister waits for the whole device to go idle (measured on the H100: a load that
// registered a chunk stalled the engine's stream behind it — the issue-36 note), so it must not
// run on an engine's thread in the middle of its work. Once a CUDA transfer has named its device
// (start()), a thread of this registry's own page-locks every chunk mapped so far and then each
// new one as LargeBufferCache maps it; a copy from a chunk not registered yet goes through the
// bounce buffer (counted as unpinned) rather than wait. Before start() a copy registers its chunk
// itself, as it always did. A registered chunk is held (never unmapped) until the last user goes.
// One registry per process: a chunk can be registered only once, and every cache shares the chunks.
#pragma once

#include <cstddef>

#include "base/memory/large_buffer_cache.h"
#include "base/status.h"
#include "inprocess/cuda/cuda_driver.h"

namespace kvtier::cuda {

// Thread-safe.
class CudaHostPinning {
 public:
  static CudaHostPinning& instance();

  // A user (an EmbeddedCache that moved a block to or from CUDA) comes and goes; the last to go
  // stops the registering thread and unregisters every chunk. Call leave() only when none of the
  // user's copies is in flight.
  void join();
  void leave();

  // Starts the registering thread with `device`'s primary context current (once; later calls do
  // nothing while a user remains). Registration with kHostRegisterPortable serves every device;
  // kHostRegisterDeviceMap maps the chunk, so kernels read it in place (unified addressing: at the
  // host's own address).
  void start(const CudaDriver& driver, int device);

  // True when [p, p + bytes) lies in a registered chunk; false when it lies outside the chunks or
  // its chunk could not be registered (logged once per chunk, and counted): the copy then still
  // works, through the driver's bounce buffer, synchronously. A chunk still queued for the
  // registering thread is waited for (once per chunk, on the copying thread: kvtier's, never the
  // engine's stream). Before start(), registers the chunk now (a context must be current).
  bool pin(const CudaDriver& driver, const void* p, size_t bytes);

  // Blocks until every chunk queued so far is registered (or failed): a cache that page-locks its
  // memory when it opens waits here, before the engine's first kernel, not beside its work.
  void wait_queued() const;

  size_t registered_bytes() const;
  size_t failed_registrations() const;
  // Chunks waiting for the registering thread.
  size_t queued_chunks() const;

 private:
  CudaHostPinning() = default;
  struct State;
  State& state() const;
  static void enqueue(LargeBufferChunk chunk);  // the chunk listener
  void run();                                   // the registering thread
};

}  // namespace kvtier::cuda
