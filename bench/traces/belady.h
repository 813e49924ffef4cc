// Belady's MIN on a trace of prefix lookups: the offline optimum a policy is measured against.
// Block-granular and chain-aware: a request's blocks count as hits up to its first miss (what a
// prefix lookup can serve); afterwards every block of the request is in the cache (the engine
// computed the missing ones), and while the cache holds more than its capacity the block whose
// next use is farthest away goes — a block never used again first, and on a tie the deeper one,
// so a child never outlives its parent (any request that uses a child uses its parent too).
#pragma once

#include <cstdint>
#include <vector>

#include "bench/traces/trace.h"
#include "cache/prefix_hasher.h"

namespace kvtier::bench {

// A trace as the blocks each request looks up, in prefix order (dense ids, not hashes).
struct BlockTrace {
  std::vector<std::vector<uint32_t>> requests;
  std::vector<uint32_t> depth;  // per block id: its position in its chain
  size_t prompt_tokens = 0;
  int block_size = 16;
};
BlockTrace to_block_trace(const Trace& trace, const PrefixHasher& hasher);

struct BeladyResult {
  uint64_t hit_blocks = 0;
  uint64_t hit_tokens = 0;
};
BeladyResult belady(const BlockTrace& trace, size_t capacity_blocks);

}  // namespace kvtier::bench
