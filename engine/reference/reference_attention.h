// CPU references for the attention kernels, written for clarity: plain loops, float
// accumulation, softmax with the maximum subtracted. Varlen covers decode (one row per sequence).
#pragma once

#include <cstdint>
#include <span>

#include "engine/attention/paged_kv.h"

namespace kvtier::reference {

// A layer's paged K/V in host memory: [num_blocks, block_size, num_kv_heads, head_dim] in dtype.
struct PagedKvHost {
  const uint8_t* k = nullptr;
  const uint8_t* v = nullptr;
  DType dtype = DType::kBF16;
  int block_size = 16;
  int num_kv_heads = 0;
  int head_dim = 0;
};

// q, out: f32 [total_rows, num_heads, head_dim]; rows of sequence i are [cu[i], cu[i+1]), the
// last of its seq_lens[i] positions; causal, with AttentionOptions' scale, soft-cap and window.
void paged_attention(const PagedKvHost& cache, const AttentionOptions& options,
                     std::span<const float> q, int num_heads, std::span<const int32_t> block_tables,
                     int max_blocks_per_seq, std::span<const int32_t> seq_lens,
                     std::span<const int32_t> cu_seqlens_q, std::span<float> out);

}  // namespace kvtier::reference
