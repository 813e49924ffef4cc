// ReshapeAndCache launches kernels/attention/reshape_and_cache.comp: new tokens' K and V,
// [num_tokens, num_kv_heads, head_dim] in `in_dtype` (F32 or the cache's dtype), written into a
// layer's paged arrays at slot_mapping[t] (i32 [num_tokens]; block = slot / block_size, -1 skips).
// Bit-exact against engine/reference: copies bits when dtypes match, rounds to nearest even
// otherwise.
#pragma once

#include "engine/attention/paged_kv.h"
#include "engine/vulkan/command_batch.h"

namespace kvtier {

class ReshapeAndCache {
 public:
  explicit ReshapeAndCache(VulkanContext& ctx) : ctx_(ctx) {}
  Status record(CommandBatch& batch, uint64_t key, uint64_t value, DType in_dtype,
                uint64_t slot_mapping, uint32_t num_tokens, const PagedKvView& cache);

 private:
  VulkanContext& ctx_;
};

}  // namespace kvtier
