// LargeBufferCache: where AlignedBuffer gets buffers of 256 KiB and more (blocks, frames, O_DIRECT
// records). glibc serves such aligned requests badly for this workload — measured: from a cold
// heap, each 2 MiB 4 KiB-aligned allocation grew the heap by 2 MiB and was faulted in page by page
// (~140 faults, ~2 ms on this VM) even with the previous ones freed. Instead, regions are mmapped
// pre-faulted (MAP_POPULATE) in 64 KiB size classes, and freed regions are kept for reuse up to a
// byte limit (beyond it they are unmapped), so steady-state block churn touches neither the kernel
// nor the page tables.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvtier {

inline constexpr size_t kLargeBufferThreshold = 256 << 10;

// Page-aligned region of at least `bytes` (rounded up to its size class). Thread-safe. Returns
// nullptr when the system is out of memory. `*fresh` is true for a new mapping (known zero).
void* large_buffer_acquire(size_t bytes, bool* fresh);
void large_buffer_release(void* p, size_t bytes);
// Bytes of freed regions kept for reuse (default 512 MiB).
void set_large_buffer_cache_limit(size_t bytes);
size_t large_buffer_cached_bytes();

// Page-aligned buffers under kLargeBufferThreshold (the O_DIRECT records of small blocks, 16 KiB
// for a small model). glibc's aligned allocation splits and re-merges heap chunks on every call:
// measured on a 16 KiB-block SSD restore, malloc_consolidate, unlink_chunk and _int_malloc took
// ~16% of the CPU. Freed ones are kept per 4 KiB size class for reuse (64 MiB at most, the rest
// goes back to the heap). Thread-safe; nullptr when out of memory.
void* small_page_buffer_acquire(size_t bytes);
void small_page_buffer_release(void* p, size_t bytes);

}  // namespace kvtier
