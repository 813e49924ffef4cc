// How a kvtier process wants glibc's allocator to behave: keep freed block-sized memory for the
// next block instead of returning it to the kernel. Blocks are MiB-sized and churn constantly
// (insert, evict, read back); with glibc's defaults each new one is mmapped or grown at the top of
// the heap and page-faulted in, which costs more than copying the block (measured on
// serialize_bench: decode 1.2 ms -> 0.4 ms per 2 MiB block). Memory use stays bounded by the
// tiers' capacities. Call once at the start of main(), before threads start.
#pragma once

namespace kvtier {

void keep_freed_block_memory();

}  // namespace kvtier
