#include "engine/attention/kv_half_staging.h"

namespace kvtier {

namespace {
struct Params {
  uint64_t k_cache, v_cache, block_tables, seq_lens, k_out, v_out, table_out;
  uint32_t block_elems, block_size, max_blocks_per_seq;
};

uint64_t half_block_bytes(const PagedKvView& cache) {
  return static_cast<uint64_t>(cache.block_size) * cache.num_kv_heads * cache.head_dim * 2;
}
}  // namespace

uint64_t KvHalfStaging::bytes(const PagedKvView& cache, uint32_t num_seqs, uint32_t max_blocks_per_seq) {
  const uint64_t slots = uint64_t{num_seqs} * max_blocks_per_seq;
  return 2 * slots * half_block_bytes(cache) + slots * 4;
}

Result<KvHalfStaging::Staged> KvHalfStaging::record(CommandBatch& batch, const PagedKvView& cache,
                                                    uint64_t block_tables, uint64_t seq_lens, uint32_t num_seqs,
                                                    uint32_t max_blocks_per_seq) {
  if (!is_kv_dtype(cache.dtype)) {
    return invalid_argument("kv_half_staging: a cache of " + std::string(dtype_name(cache.dtype)) + " is not KV");
  }
  const uint64_t elems = static_cast<uint64_t>(cache.block_size) * cache.num_kv_heads * cache.head_dim;
  if (elems % 8 != 0) return invalid_argument("kv_half_staging: a block's elements must be a multiple of 8");
  const uint32_t* grid = ctx_.info().max_workgroup_count;
  if (max_blocks_per_seq == 0 || num_seqs == 0 || max_blocks_per_seq > grid[0] || num_seqs > grid[1]) {
    return invalid_argument("kv_half_staging: " + std::to_string(num_seqs) + " sequences x " +
                            std::to_string(max_blocks_per_seq) + " blocks do not fit the device's grid");
  }
  const uint64_t need = bytes(cache, num_seqs, max_blocks_per_seq);
  if (!staging_ || staging_->size() < need) {
    // Batches recorded earlier keep the old buffer: they hold it.
    KVTIER_ASSIGN_OR_RETURN(GpuBuffer grown, GpuBuffer::create(ctx_, need, MemoryKind::kDevice));
    staging_ = std::make_shared<GpuBuffer>(std::move(grown));
  }
  batch.retain(staging_);
  KVTIER_ASSIGN_OR_RETURN(auto pipeline, ctx_.pipeline("kv_half_staging", {kernel_dtype(cache.dtype)}, sizeof(Params)));
  const uint64_t half_bytes = uint64_t{num_seqs} * max_blocks_per_seq * half_block_bytes(cache);
  Staged out;
  out.cache = cache;
  out.cache.dtype = DType::kF16;
  out.cache.num_blocks = num_seqs * max_blocks_per_seq;
  out.cache.k = staging_->address();
  out.cache.v = out.cache.k + half_bytes;
  out.block_tables = out.cache.v + half_bytes;
  Params p{cache.k, cache.v, block_tables, seq_lens, out.cache.k, out.cache.v, out.block_tables,
           static_cast<uint32_t>(elems), cache.block_size, max_blocks_per_seq};
  batch.dispatch(*pipeline, p, max_blocks_per_seq, num_seqs);
  batch.barrier();
  return out;
}

}  // namespace kvtier
