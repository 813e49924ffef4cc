#include "base/memory/memory_policy.h"

#include <malloc.h>

namespace kvtier {

void keep_freed_block_memory() {
  // Allocations below 64 MiB come from the heap (blocks, frames, staging), and the heap is not
  // trimmed until 1 GiB sits free at its top.
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

}  // namespace kvtier
