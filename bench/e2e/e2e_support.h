// What e2e_bench's tables share: stopping on an error (a benchmark that cannot run says why and
// exits), milliseconds for the tables, the block size, and the synthetic prompts.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "base/elapsed.h"
#include "base/status.h"
#include "bench/harness/bench_report.h"
#include "cache/cache_stack.h"
#include "engine/model/llama_model.h"

namespace kvtier::bench {

inline constexpr int kE2eBlockSize = 16;

[[noreturn]] inline void die(const Status& s) {
  std::cerr << "e2e_bench: " << s.to_string() << "\n";
  std::exit(1);
}
template <typename T>
T must(Result<T> r) {
  if (!r.ok()) die(r.status());
  return std::move(r).value();
}
inline void must(const Status& s) {
  if (!s.ok()) die(s);
}
inline std::string ms(double s) { return fmt_double(s * 1e3, s < 0.01 ? 3 : 1); }

// n token ids below `vocab`, a fixed sequence: the same prompt in every run.
inline std::vector<int32_t> prompt_tokens(int n, int vocab) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = (i * 7919 + (i * i) % 101) % vocab;
  return t;
}

// One sequence's whole prompt as a forward batch over the given blocks (in order), the last
// row's logits returned.
inline ForwardBatch prompt_batch(const std::vector<int32_t>& tokens,
                                 const std::vector<int32_t>& block_ids) {
  const int n = static_cast<int>(tokens.size());
  ForwardBatch b;
  b.tokens = tokens;
  for (int i = 0; i < n; ++i) {
    b.positions.push_back(i);
    b.slot_mapping.push_back(block_ids[i / kE2eBlockSize] * kE2eBlockSize + i % kE2eBlockSize);
  }
  b.cu_seqlens_q = {0, n};
  b.seq_lens = {n};
  b.block_tables = block_ids;
  b.max_blocks_per_seq = static_cast<int32_t>(block_ids.size());
  b.logit_rows = {n - 1};
  return b;
}

// The two stacks the tiny tables compare, for a prompt of `blocks` blocks: GPU + RAM with room for
// everything (`extra_ram` more bytes), and the same GPU over a RAM of 1.5 blocks and an SSD tier
// in `ssd_dir` (wiped), so what the GPU evicts lands on the SSD.
struct TinyStacks {
  CacheStackOptions ram, ssd;
};
inline TinyStacks tiny_stacks(VulkanContext& ctx, std::shared_ptr<const KvLayout> layout,
                              uint32_t blocks, uint64_t extra_ram, const std::string& ssd_dir) {
  TinyStacks t;
  t.ram.layout = layout;
  t.ram.vulkan = &ctx;
  t.ram.gpu_pool.num_blocks = 2 * blocks + 16;
  t.ram.ram.capacity_bytes = (blocks + 16) * (layout->dense_block_bytes() + 4096) + extra_ram;
  t.ssd = t.ram;
  t.ssd.ram.capacity_bytes = layout->dense_block_bytes() * 3 / 2;
  t.ssd.ssd.emplace();
  t.ssd.ssd->dir = ssd_dir;
  t.ssd.ssd->reset = true;
  return t;
}

}  // namespace kvtier::bench
