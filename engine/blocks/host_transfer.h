// HostTransfer: moves blocks between host memory and a GpuBlockPool, for the GPU tier. A download
// gathers blocks into device staging (one kernel) and copies them out; an upload copies blocks in
// and scatters them (one kernel), or, where the device imports host memory, one kernel reads each
// block where it lies. Host memory that is not imported goes through host-visible staging with a
// CPU copy (on several threads for large batches). Copy regions of blocks adjacent on both ends
// are merged: the driver charges per region.
//
// Not thread-safe: the staging buffers are shared by every transfer (the caller serializes them).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "base/status.h"
#include "engine/blocks/block_transfer.h"
#include "engine/blocks/gpu_block_pool.h"
#include "engine/vulkan/gpu_buffer.h"
#include "engine/vulkan/host_memory_import.h"
#include "serialize/block.h"

namespace kvtier {

class HostTransfer {
 public:
  static Result<std::unique_ptr<HostTransfer>> create(VulkanContext& ctx, GpuBlockPool& pool);

  // What a transfer did, for the caller's metrics.
  struct Counts {
    uint64_t direct = 0;           // blocks copied from or into host memory where they lie
    uint64_t import_failures = 0;  // chunks whose import failed: their blocks were staged
    uint64_t copy_regions = 0;     // regions of the host<->device copy commands recorded
  };
  // Copies pool blocks `ids` into `out` (one dense block each, same order).
  Status download(std::span<const int32_t> ids, std::span<Block> out, Counts& counts);
  // Copies blocks[todo[k]] into pool block ids[k]; quantized blocks go up dense.
  Status upload(std::span<const std::shared_ptr<const Block>> blocks, std::span<const size_t> todo,
                std::span<const int32_t> ids, Counts& counts);

  // Uploads read host blocks where they lie, in one launch: the device imports host memory and
  // VulkanOptions::upload_in_place is on. On the H100 a RAM hit's copy regions (one per run of
  // adjacent blocks, ~0.5 per block) cost more than its bytes: 16 MiB of 32 KiB blocks took
  // 1.6 ms, 10 GB/s.
  bool reads_in_place() const { return read_in_place_; }
  // Host memory imported so far (0 without import).
  uint64_t imported_bytes() const { return host_ ? host_->imported_bytes() : 0; }

 private:
  HostTransfer(VulkanContext& ctx, GpuBlockPool& pool, BlockTransfer kernels);
  // How block i (of host[i], block_bytes() each) crosses between host memory and device staging
  // slot i: straight from/into where it lies when that memory is imported, else through slot j
  // of the upload/download buffer with a CPU copy (block i = staged[j]). A null host[i] is staged.
  struct CopyPlan {
    std::map<VkBuffer, std::vector<VkBufferCopy>> direct;  // by imported buffer
    std::vector<VkBufferCopy> staged_regions;               // upload/download buffer <-> staging
    std::vector<size_t> staged;
  };
  CopyPlan plan_copies(std::span<const uint8_t* const> host, bool to_device, Counts& counts);
  void record_copies(CommandBatch& batch, const CopyPlan& plan, bool to_device, Counts& counts);
  // Device staging for `blocks` blocks; the host-visible upload and download buffers for
  // `host_blocks` of them (those not copied directly; none while all are).
  Status ensure_staging(uint64_t blocks, uint64_t host_blocks);
  // The id list and the source table for `blocks` blocks.
  Status ensure_tables(uint64_t blocks);
  // Block todo[staged[j]]'s bytes into upload buffer slot j by a CPU copy (dequantized if need be).
  Status stage(std::span<const std::shared_ptr<const Block>> blocks, std::span<const size_t> todo,
               std::span<const size_t> staged);
  // Upload by one kernel reading each block where it lies (read_in_place_).
  Status upload_in_place(std::span<const std::shared_ptr<const Block>> blocks, std::span<const size_t> todo,
                         std::span<const uint8_t* const> host, Counts& counts);

  VulkanContext& ctx_;
  GpuBlockPool& pool_;
  BlockTransfer kernels_;
  std::unique_ptr<HostMemoryImport> host_;  // null when the device cannot import host memory
  bool read_in_place_ = false;
  GpuBuffer device_staging_, upload_, download_, ids_, sources_;
  uint64_t staging_blocks_ = 0, host_staging_blocks_ = 0, table_blocks_ = 0;
};

}  // namespace kvtier
