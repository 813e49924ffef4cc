#include "engine/attention/reshape_and_cache.h"

namespace kvtier {

namespace {
struct Params {
  uint64_t key, value, k_cache, v_cache, slot_mapping;
  uint32_t num_tokens, num_kv_heads, head_dim, in_dtype, cache_dtype;
};
}  // namespace

Status ReshapeAndCache::record(CommandBatch& batch, uint64_t key, uint64_t value, DType in_dtype,
                               uint64_t slot_mapping, uint32_t num_tokens, const PagedKvView& cache) {
  if (num_tokens == 0) return ok_status();
  if (!is_kv_dtype(in_dtype) || !is_kv_dtype(cache.dtype) || cache.head_dim % 2 != 0) {
    return invalid_argument("reshape_and_cache: dtypes must be F32/F16/BF16 and head_dim even");
  }
  KVTIER_ASSIGN_OR_RETURN(auto pipeline, ctx_.pipeline("reshape_and_cache", {}, sizeof(Params)));
  Params p{key, value, cache.k, cache.v, slot_mapping, num_tokens, cache.num_kv_heads,
           cache.head_dim, kernel_dtype(in_dtype), kernel_dtype(cache.dtype)};
  const uint64_t pairs = static_cast<uint64_t>(num_tokens) * cache.num_kv_heads * cache.head_dim / 2;
  batch.dispatch(*pipeline, p, static_cast<uint32_t>((pairs + 255) / 256));
  batch.barrier();
  return ok_status();
}

}  // namespace kvtier
