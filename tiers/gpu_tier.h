// GpuTier: the Tier interface over a GpuBlockPool — the top tier, where the attention engine reads
// blocks. Eviction happens when a free cached block is reused: its bytes are gathered (one
// kernel), copied to host memory (one copy) and handed down as a dense Block. Promotion copies
// host blocks up (one copy, one scatter kernel), many blocks per submission. The model allocates
// its working blocks here too (allocate, publish, release), so evictions it triggers are saved.
#pragma once

#include <map>
#include <mutex>
#include <vector>
#include <unordered_map>

#include "base/log.h"
#include "engine/blocks/block_transfer.h"
#include "engine/blocks/gpu_block_pool.h"
#include "engine/vulkan/host_memory_import.h"
#include "tiers/tier.h"

namespace kvtier {

struct GpuTierMetrics {
  Counter inserts;
  Counter duplicate_inserts;
  Counter rejected;
  Counter evictions;        // cached blocks copied out to make room
  Counter uploads;          // blocks copied host -> GPU
  Counter downloads;        // blocks copied GPU -> host
  Counter bytes_up;
  Counter bytes_down;
  Counter transfer_failures;
  // Blocks the GPU copied from or into host memory where they lie (imported), without a CPU copy
  // through a staging buffer; and chunks of host memory whose import failed (their blocks are
  // staged instead).
  Counter direct_up;
  Counter direct_down;
  Counter import_failures;
  // Regions of the host<->GPU copy commands recorded: blocks that lie side by side on both ends
  // share one (the driver charges per region).
  Counter copy_regions;
  Histogram upload_seconds;
  Histogram download_seconds;
};

// Thread-safe; transfers are serialized by one mutex (they share staging buffers).
class GpuTier final : public Tier {
 public:
  static Result<std::unique_ptr<GpuTier>> create(VulkanContext& ctx, GpuBlockPool& pool);

  std::string_view name() const override { return "gpu"; }
  bool accepts(const KvLayout& layout) const override;
  Result<InsertOutcome> insert(BlockRef block) override;
  std::vector<Result<InsertOutcome>> insert_many(std::span<const BlockRef> blocks) override;
  bool contains(const BlockHash& hash) const override;
  Presence probe(const BlockRequest& request) const override;
  Result<BlockRef> read(const BlockRequest& request) override;
  std::vector<Result<BlockRef>> read_many(std::span<const BlockRequest> requests) override;
  bool erase(const BlockHash& hash) override;
  bool pin(const BlockHash& hash) override;
  void unpin(const BlockHash& hash) override;
  std::vector<bool> contains_many(std::span<const BlockHash> hashes) const override;
  std::vector<PinResult> pin_many(std::span<const BlockRequest> requests) override;
  void unpin_many(std::span<const BlockHash> hashes) override;
  std::optional<int32_t> device_slot(const BlockHash& hash) const override;
  uint64_t capacity_bytes() const override;
  uint64_t used_bytes() const override;
  size_t block_count() const override { return pool_.cached_blocks(); }
  void visit_metrics(MetricVisitor& visitor) const override;

  // The model's working blocks: fresh blocks (reference count 1; evicted contents saved first),
  // published once full, released when the request is done.
  Result<std::vector<int32_t>> allocate(uint32_t n);
  // Publishes a computed block. If its hash is already cached elsewhere, that block's id is
  // returned and `id` stays unpublished.
  std::optional<int32_t> publish(int32_t id, BlockIdentity identity);
  void release(std::span<const int32_t> ids);

  GpuBlockPool& pool() { return pool_; }
  const GpuTierMetrics& metrics() const { return metrics_; }
  // Uploads read blocks where they lie in host memory, in one launch (see read_in_place_).
  bool reads_in_place() const { return read_in_place_; }

 private:
  GpuTier(VulkanContext& ctx, GpuBlockPool& pool, BlockTransfer transfer);
  // Copies blocks `ids` to host Blocks with `identities` (caller holds transfer_mu_).
  Result<std::vector<BlockRef>> download(std::span<const int32_t> ids,
                                         std::span<const BlockIdentity> identities);
  // Device staging for `blocks` blocks; the host-visible upload and download buffers for
  // `host_blocks` of them (those not copied directly; none while all are).
  Status ensure_staging(uint64_t blocks, uint64_t host_blocks);
  // The id list and the source table for `blocks` blocks.
  Status ensure_tables(uint64_t blocks);
  // Uploads blocks[todo] into GPU blocks `ids` (caller holds transfer_mu_). Where the device reads
  // imported host memory in place, one launch reads each block where it lies; else each block
  // is copied into device staging (a copy region per run of adjacent blocks) and scattered.
  Status upload(std::span<const BlockRef> blocks, std::span<const size_t> todo, std::span<const int32_t> ids);
  // How block i (of host[i], block_bytes() each) crosses between host memory and device staging
  // slot i: straight from/into where it lies when that memory is imported, else through slot j
  // of the upload/download buffer with a CPU copy (block i = staged[j]). A null host[i] is staged.
  struct HostCopyPlan {
    std::map<VkBuffer, std::vector<VkBufferCopy>> direct;  // by imported buffer
    std::vector<VkBufferCopy> staged_regions;               // upload/download buffer <-> staging
    std::vector<size_t> staged;
  };
  HostCopyPlan plan_host_copies(std::span<const uint8_t* const> host, bool to_device);
  void record_host_copies(CommandBatch& batch, const HostCopyPlan& plan, bool to_device);

  VulkanContext& ctx_;
  GpuBlockPool& pool_;
  BlockTransfer transfer_;
  std::mutex transfer_mu_;  // guards the staging buffers below
  std::unique_ptr<HostMemoryImport> host_;  // null when the device cannot import host memory
  // Uploads read blocks in place (scatter_blocks_from): host_ is set and KVTIER_VK_UPLOAD_IN_PLACE
  // is not 0. On the H100 a RAM hit's copy regions (one per run of adjacent blocks, ~0.5 per
  // block) cost more than its bytes: 16 MiB of 32 KiB blocks took 1.6 ms, 10 GB/s.
  bool read_in_place_ = false;
  GpuBuffer device_staging_, upload_, download_, ids_, sources_;
  uint64_t staging_blocks_ = 0, host_staging_blocks_ = 0, table_blocks_ = 0;
  // Blocks the pool evicted that the tier below has not taken yet: held from the eviction until
  // the sink returns, so a lookup meanwhile still finds them here (read from host memory). Null
  // while the download that saves them runs; a read waits for it on transfer_mu_. Taken after
  // transfer_mu_ when both are held.
  mutable std::mutex leaving_mu_;
  std::unordered_map<BlockHash, BlockRef> leaving_;
  // The leaving block of `hash`, once its download is done (caller holds neither lock).
  BlockRef leaving_block(const BlockHash& hash);
  mutable std::mutex pin_mu_;  // guards pinned_
  std::unordered_map<BlockHash, std::pair<int32_t, int>> pinned_;  // hash -> (block, pins)
  GpuTierMetrics metrics_;
  LogThrottle failure_log_;
};

}  // namespace kvtier
