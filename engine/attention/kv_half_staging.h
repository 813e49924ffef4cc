// KvHalfStaging launches kernels/attention/kv_half_staging.comp: a varlen batch's context blocks
// of one layer (K and V in any KV dtype) copied as f16 into a staging cache whose block table is
// the identity, so the tensor-core prefill reads f16 chunks as they are, without converting each
// chunk every time a tile reads it or reading the block table before each load. The conversion
// is the kernel's own: the attention's bits do not change.
#pragma once

#include <memory>

#include "engine/attention/paged_kv.h"
#include "engine/vulkan/command_batch.h"

namespace kvtier {

class KvHalfStaging {
 public:
  explicit KvHalfStaging(VulkanContext& ctx) : ctx_(ctx) {}

  struct Staged {
    PagedKvView cache;          // f16, num_seqs * max_blocks_per_seq blocks
    uint64_t block_tables = 0;  // i32 [num_seqs, max_blocks_per_seq]: sequence s's block j is s * max + j
  };
  // Bytes of staging a batch of this shape takes.
  static uint64_t bytes(const PagedKvView& cache, uint32_t num_seqs, uint32_t max_blocks_per_seq);
  // Records the copy of blocks [0, ceil(seq_lens[s] / block_size)) of each sequence (block_tables
  // and seq_lens as the attention takes them, on the device) and a barrier. The staging buffer
  // is this object's, grown on demand and held by every batch that uses it; a later record()
  // overwrites it, in the batches' order, as the attention launchers' scratch buffers are.
  Result<Staged> record(CommandBatch& batch, const PagedKvView& cache, uint64_t block_tables,
                        uint64_t seq_lens, uint32_t num_seqs, uint32_t max_blocks_per_seq);
  // The staging buffer the last record() used (tests read it back).
  const std::shared_ptr<GpuBuffer>& buffer() const { return staging_; }

 private:
  VulkanContext& ctx_;
  std::shared_ptr<GpuBuffer> staging_;  // K blocks, V blocks, then the block table
};

}  // namespace kvtier
