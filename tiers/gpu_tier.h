// GpuTier: the Tier interface over a GpuBlockPool — the top tier, where the attention engine reads
// blocks. Eviction happens when a free cached block is reused: its bytes are copied to host memory
// and handed down as a dense Block. Promotion copies host blocks up, many per submission (both
// through engine/blocks/host_transfer.h). The model allocates its working blocks here too
// (allocate, publish, release), so evictions it triggers are saved.
#pragma once

#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "base/log.h"
#include "engine/blocks/gpu_block_pool.h"
#include "engine/blocks/host_transfer.h"
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
  // The pool keeps the books: it tells of the hashes it caches and lets go.
  void set_block_events(std::shared_ptr<BlockEventSink> sink) override {
    pool_.set_events(std::move(sink));
  }
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
  void unpin_pinned(std::span<const BlockHash> hashes, std::span<const int32_t> slots) override;
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
  // Uploads read blocks where they lie in host memory, in one launch.
  bool reads_in_place() const { return transfer_->reads_in_place(); }

 private:
  GpuTier(GpuBlockPool& pool, std::unique_ptr<HostTransfer> transfer);
  // Copies blocks `ids` to host Blocks with `identities` (caller holds transfer_mu_).
  Result<std::vector<BlockRef>> download(std::span<const int32_t> ids,
                                         std::span<const BlockIdentity> identities);
  // Uploads blocks[todo] into GPU blocks `ids` (caller holds transfer_mu_).
  Status upload(std::span<const BlockRef> blocks, std::span<const size_t> todo, std::span<const int32_t> ids);
  void count(const HostTransfer::Counts& c, bool to_device);

  GpuBlockPool& pool_;
  std::mutex transfer_mu_;  // serializes transfers: they share staging buffers
  std::unique_ptr<HostTransfer> transfer_;
  // Blocks the pool evicted that the tier below has not taken yet: held from the eviction until
  // the sink returns, so a lookup meanwhile still finds them here (read from host memory). Null
  // while the download that saves them runs; a read waits for it on transfer_mu_. Taken after
  // transfer_mu_ when both are held.
  mutable std::mutex leaving_mu_;
  std::unordered_map<BlockHash, BlockRef> leaving_;
  // The leaving block of `hash`, once its download is done (caller holds neither lock).
  BlockRef leaving_block(const BlockHash& hash);
  mutable std::mutex pin_mu_;  // guards pinned_
  // pin()'s pins: hash -> (block, pins). pin_many()'s are only the pool's references.
  std::unordered_map<BlockHash, std::pair<int32_t, int>> pinned_;
  GpuTierMetrics metrics_;
  LogThrottle failure_log_;
};

}  // namespace kvtier
