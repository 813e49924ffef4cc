// LargeBufferCache: where AlignedBuffer gets buffers of 16 KiB and more (blocks, frames, O_DIRECT
// records). glibc serves such aligned requests badly for this workload — measured: from a cold
// heap, each 2 MiB 4 KiB-aligned allocation grew the heap by 2 MiB and was faulted in page by page
// (~140 faults, ~2 ms on this VM) even with the previous ones freed. Instead, buffers are slots of
// large mmapped chunks (one size class per chunk: 4 KiB classes under 256 KiB, 64 KiB classes
// above), pre-faulted when first handed out, and freed slots are kept for reuse up to a byte limit
// (beyond it their pages go back to the kernel), so steady-state block churn touches neither the
// kernel nor the page tables.
//
// Chunks are also what a GPU imports (engine/vulkan/host_memory_import.h): a few large regions that
// hold every block in host memory, so a block goes to the GPU by DMA from where it lies, without a
// CPU copy into staging. A held chunk is never unmapped and its pages never dropped.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace kvtier {

// 16 KiB, not more: host blocks of small models (the `tiny` preset's 16 KiB, Qwen2.5-0.5B's 192
// KiB) must lie in chunks too, or the GPU cannot copy them from where they lie.
inline constexpr size_t kLargeBufferThreshold = 16 << 10;

// Page-aligned region of at least `bytes` (rounded up to its size class). Thread-safe. Returns
// nullptr when the system is out of memory. `*fresh` is true when the region is known zero.
void* large_buffer_acquire(size_t bytes, bool* fresh);
void large_buffer_release(void* p, size_t bytes);
// Bytes of freed regions kept for reuse (default 512 MiB).
void set_large_buffer_cache_limit(size_t bytes);
size_t large_buffer_cached_bytes();

// The chunk a large buffer lies in (page-aligned base, bytes); {nullptr, 0} for any other pointer.
struct LargeBufferChunk {
  const uint8_t* base = nullptr;
  size_t bytes = 0;
};
LargeBufferChunk large_buffer_chunk(const void* p);
// While held (holds nest), a chunk stays mapped and keeps its pages even when every slot is free:
// memory a device imported must outlive the import. `base` is a chunk's base.
void large_buffer_hold_chunk(const void* base);
void large_buffer_unhold_chunk(const void* base);
// Called with each chunk as it is mapped, on the allocating thread after the arena's lock is let
// go, while set (nullptr: none). It must be quick and must not allocate large buffers: a CUDA door
// hands the chunk to its own thread to page-lock (inprocess/cuda/cuda_host_pinning.h), so no copy
// on an engine's thread ever waits for the registration.
using LargeBufferChunkListener = void (*)(LargeBufferChunk chunk);
void set_large_buffer_chunk_listener(LargeBufferChunkListener listener);
// Every chunk mapped now.
std::vector<LargeBufferChunk> large_buffer_chunks();
// Maps chunks of `bytes`' size class until it has free slots for `count` buffers, and holds every
// chunk of the class that has free slots (release each with large_buffer_unhold_chunk): memory a
// cache page-locks for a GPU when it opens (inprocess/cuda/cuda_host_pinning.h), so that no chunk
// is mapped, and none registered, while an engine runs. The listener hears of each new chunk.
// nullopt when the system is out of memory (nothing stays held then).
std::optional<std::vector<LargeBufferChunk>> large_buffer_reserve(size_t bytes, size_t count);

// Page-aligned buffers under kLargeBufferThreshold (the O_DIRECT records of the smallest blocks,
// quantized ones of a small model). glibc's aligned allocation splits and re-merges heap chunks on
// every call: measured on a 16 KiB-block SSD restore, malloc_consolidate, unlink_chunk and
// _int_malloc took ~16% of the CPU. Freed ones are kept per 4 KiB size class for reuse (64 MiB at
// most, the rest goes back to the heap). Thread-safe; nullptr when out of memory.
void* small_page_buffer_acquire(size_t bytes);
void small_page_buffer_release(void* p, size_t bytes);

}  // namespace kvtier
