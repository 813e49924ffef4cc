// CudaHostPinning: page-locks the host memory kvtier's blocks live in, so a GPU copies them by DMA
// straight from where they lie (and into fresh blocks on a save) instead of through the driver's
// own bounce buffer. Blocks live in LargeBufferCache's chunks (base/memory/large_buffer_cache.h);
// each chunk is registered with the CUDA driver the first time a transfer touches it, held (never
// unmapped) while registered, and unregistered when the last user goes. One registry per process:
// a chunk can be registered only once, and every cache's blocks share the chunks.
#pragma once

#include <cstddef>

#include "base/status.h"
#include "inprocess/cuda/cuda_driver.h"

namespace kvtier::cuda {

// Thread-safe.
class CudaHostPinning {
 public:
  static CudaHostPinning& instance();

  // A user (an EmbeddedCache that moved a block to or from CUDA) comes and goes; the last to go
  // unregisters every chunk. Call leave() only when none of the user's copies is in flight.
  void join();
  void leave();

  // True when [p, p + bytes) lies in a registered chunk (registering it now if needed); false when
  // it lies outside the chunks, or its chunk could not be registered (logged once per chunk, and
  // counted): the copy then still works, through the driver's bounce buffer, synchronously.
  // A context must be current (ScopedDeviceContext).
  bool pin(const CudaDriver& driver, const void* p, size_t bytes);

  size_t registered_bytes() const;
  size_t failed_registrations() const;

 private:
  CudaHostPinning() = default;
  struct State;
  State& state() const;
};

}  // namespace kvtier::cuda
