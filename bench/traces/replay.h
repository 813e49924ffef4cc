// Replays a trace through the real cache stack — a real RamTier with the policy under test and a
// real SsdTier (files, io_uring, RocksDB) in a scratch directory — the way an engine drives it:
// per request, fetch the cached prefix (promoting what comes off the SSD), then publish every
// block computed after it. Blocks are tiny (one layer, one head, head_dim 8) so that a trace of
// millions of tokens fits; capacities are given in blocks.
#pragma once

#include <cstdint>
#include <string>

#include "bench/traces/trace.h"
#include "serialize/kv_layout.h"

namespace kvtier::bench {

struct ReplayOptions {
  std::string eviction = "lru";  // the RAM tier's policy (tiers/policy)
  std::string admission = "all";  // which blocks leaving RAM are written to the SSD
  size_t ram_blocks = 1024;
  size_t ssd_blocks = 0;  // 0: no SSD tier
  std::string scratch_dir;  // for the SSD tier
  uint32_t block_tokens = 16;  // the trace's (Trace::block_tokens)
};

struct ReplayResult {
  uint64_t prompt_tokens = 0;
  uint64_t hit_tokens_ram = 0;  // served from the RAM tier
  uint64_t hit_tokens_ssd = 0;  // served from the SSD tier
  uint64_t ssd_blocks_written = 0;
  uint64_t ssd_bytes_written = 0;
  uint64_t ssd_blocks_read_back = 0;  // distinct blocks of those written that a fetch served
  uint64_t not_admitted = 0;
  double seconds = 0;
  double hit_ratio() const {
    return prompt_tokens ? static_cast<double>(hit_tokens_ram + hit_tokens_ssd) / prompt_tokens : 0;
  }
};

Result<ReplayResult> replay(const Trace& trace, const ReplayOptions& options);

// The layout replays use at a block size, and what one of its blocks costs in each tier (for
// capacities).
std::shared_ptr<const KvLayout> replay_layout(uint32_t block_tokens = 16);
uint64_t replay_ram_bytes_per_block(uint32_t block_tokens = 16);
uint64_t replay_ssd_bytes_per_block(uint32_t block_tokens = 16);

}  // namespace kvtier::bench
