// PagedKvView: one layer's paged K and V arrays on the GPU, as the kernels see them:
// [num_blocks, block_size, num_kv_heads, head_dim] in `dtype`, by device address.
#pragma once

#include <cstdint>

#include "serialize/dtype.h"

namespace kvtier {

struct PagedKvView {
  uint64_t k = 0;  // device address of the K array
  uint64_t v = 0;
  uint32_t num_blocks = 0;
  uint32_t block_size = 16;
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;
  DType dtype = DType::kBF16;

  uint64_t block_bytes() const {
    return static_cast<uint64_t>(block_size) * num_kv_heads * head_dim * dtype_size(dtype);
  }
};

// Attention options shared by the decode and varlen kernels (and their CPU reference).
struct AttentionOptions {
  float scale = 1.0f;    // usually 1 / sqrt(head_dim)
  float softcap = 0.0f;  // 0: off; else scores become softcap * tanh(score / softcap)
  int window = 0;        // 0: off; else a query at position p sees positions (p - window, p]
};

// The kernels' dtype codes (kernels/common/dtype.glsl).
inline uint32_t kernel_dtype(DType d) {
  return d == DType::kF32 ? 0u : d == DType::kF16 ? 1u : 2u;
}

}  // namespace kvtier
