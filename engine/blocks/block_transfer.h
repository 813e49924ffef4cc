// BlockTransfer launches kernels/blocks/gather_blocks.comp and scatter_blocks.comp over every layer
// of one model's paged KV cache: a list of GPU block ids is packed into (or unpacked from) one
// contiguous staging buffer, block after block, each block's bytes in its document's tensor order
// (layers.0.k, layers.0.v, layers.1.k, ...) — exactly a dense Block's data, so a block crosses
// between GPU and host in one copy. Exact.
#pragma once

#include <span>
#include <vector>

#include "engine/attention/paged_kv.h"
#include "engine/vulkan/command_batch.h"

namespace kvtier {

// Not thread-safe to create; record_* may be called from one thread at a time.
class BlockTransfer {
 public:
  // `layers` are the model's layers in order; their tables are uploaded once.
  static Result<BlockTransfer> create(VulkanContext& ctx, std::span<const PagedKvView> layers);

  // Bytes of one block in staging (all layers, K and V).
  uint64_t block_bytes() const { return block_bytes_; }
  // block_ids: device i32 [count]; staging: device address of count * block_bytes() bytes.
  Status record_gather(CommandBatch& batch, uint64_t block_ids, uint32_t count, uint64_t staging);
  Status record_scatter(CommandBatch& batch, uint64_t staging, uint64_t block_ids, uint32_t count);
  // sources: device u64 [count], the device address of each block's bytes (memory the GPU can
  // read: device, host-visible, or imported host memory). No staging buffer.
  Status record_scatter_from(CommandBatch& batch, uint64_t sources, uint64_t block_ids, uint32_t count);

 private:
  BlockTransfer(VulkanContext& ctx) : ctx_(&ctx) {}
  // staging advances staging_stride bytes per block (a block's bytes, or a table entry).
  Status record(const char* kernel, CommandBatch& batch, uint64_t block_ids, uint32_t count,
                uint64_t staging, uint64_t staging_stride);
  VulkanContext* ctx_;
  GpuBuffer tables_;  // u64 addresses [T] | u32 bytes [T] | u32 prefix [T + 1]
  uint32_t num_tensors_ = 0;
  uint64_t block_bytes_ = 0;
};

}  // namespace kvtier
