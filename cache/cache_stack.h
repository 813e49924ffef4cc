// CacheStack: the tiers one deployment runs, built from options and owned together — GPU (when a
// Vulkan device and a block budget are given) → RAM → SSD (when a directory is given) — with the
// TieredCache over them (the SSD tier over one directory per drive), and a remote tier on Redis at the bottom when one is named. kvtierd, the
// Python module, the benchmarks and the end-to-end tests all build theirs here, so they exercise
// the same wiring. Closing drains the SSD and remote writers and releases the directory.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "cache/events/kv_event_publisher.h"
#include "cache/tiered_cache.h"
#include "engine/blocks/gpu_block_pool.h"
#include "serialize/layout_registry.h"
#include "tiers/gpu_tier.h"
#include "tiers/ram_tier.h"
#include "tiers/remote/remote_tier.h"
#include "tiers/ssd/ssd_options.h"
#include "tiers/ssd/striped_ssd_tier.h"

namespace kvtier {

struct CacheStackOptions {
  std::shared_ptr<const KvLayout> layout;
  VulkanContext* vulkan = nullptr;  // with gpu_pool sized: a GPU tier on top
  GpuBlockPoolOptions gpu_pool;     // num_blocks or byte_budget; both 0 = no GPU tier
  RamTierOptions ram;
  std::optional<SsdTierOptions> ssd;  // set = SSD tier below RAM
  std::optional<RemoteTierOptions> remote;  // set = a tier shared with other hosts, at the bottom
  std::string ssd_admission = "all";  // which blocks leaving RAM are written to the SSD (tiers/policy)
  uint64_t ssd_write_budget =
      0;  // bytes a day the SSD may be written (WriteBudgetAdmission); 0: none
  // set = every tier's blocks entering and leaving it published for routers (KvEventPublisher)
  std::optional<KvEventsOptions> kv_events;
};

class CacheStack {
 public:
  static Result<std::unique_ptr<CacheStack>> open(CacheStackOptions options);
  ~CacheStack();
  CacheStack(const CacheStack&) = delete;
  CacheStack& operator=(const CacheStack&) = delete;

  const KvLayout& layout() const { return *layout_; }
  const std::shared_ptr<const KvLayout>& layout_ptr() const { return layout_; }
  TieredCache& cache() { return *cache_; }
  GpuBlockPool* gpu_pool() { return pool_.get(); }
  GpuTier* gpu() { return gpu_.get(); }
  RamTier& ram() { return *ram_; }
  StripedSsdTier* ssd() { return ssd_.get(); }
  RemoteTier* remote() { return remote_.get(); }
  // The KV events' publisher when options.kv_events was set.
  KvEventPublisher* kv_events() { return events_.get(); }
  // The cache's and tiers' metrics, and the KV events' publisher's.
  void visit_metrics(MetricVisitor& visitor) const;
  // The layouts the SSD and remote tiers decode records with: the stack's, and any added later
  // (a hybrid model's snapshot layout, HybridPrefixCache::create).
  LayoutRegistry& layouts() { return *layouts_; }

  // Takes every free GPU block for new contents and gives it back, so each cached, unpinned block
  // is copied down the cascade. Used to put blocks where a test or benchmark wants them.
  Status evict_gpu();
  // For a clean shutdown: waits for the spill queue, then hands every block that only the GPU or
  // RAM holds to the SSD writer and waits for it to be written, until `deadline`; each prompt's
  // deepest blocks go first. Blocks RAM held that these writes reclaimed from the SSD are
  // written once more when the SSD kept all of the first writes.
  struct Persisted {
    size_t written = 0;  // indexed after a durable write: what a restart serves
    size_t refused = 0;  // not taken by rule: their namespace at its SSD quota (counted there)
    size_t lost = 0;  // taken but not written (ENOSPC, an I/O error), cut off by the deadline, or
                      // written and then reclaimed for a later one (an SSD smaller than RAM)
    // Blocks RAM held that were on the SSD already and were reclaimed for these writes (and not
    // written again): held by this host, not served after a restart.
    size_t displaced = 0;
    // Why, for the log: blocks the tier would not queue (a full queue, an encode failure) and
    // those the deadline cut off, exactly; and what the SSD's counters saw while it ran (moved
    // blocks included): writes that failed, and blocks reclaimed for room (the SSD at its
    // capacity).
    size_t not_queued = 0, cut_off = 0;
    uint64_t failed_writes = 0, reclaimed = 0;
    // Blocks RAM held that a restart will not serve.
    size_t not_kept() const { return lost + displaced; }
  };
  Persisted persist_to_ssd(std::chrono::steady_clock::time_point deadline);
  // Drains the SSD writer (bounded by its drain_timeout) and the remote writer (as long again) and
  // closes the tiers; returns the queued blocks each could not write. Idempotent.
  struct Dropped {
    size_t ssd = 0;     // lost to this host
    size_t remote = 0;  // not shared with other hosts (a remote failure is a miss there)
  };
  Dropped close();

 private:
  // Opens the publisher, gives every tier its medium's sink, and announces a start: everything a
  // router held for this publisher is gone, then what the SSD kept.
  Status start_kv_events(const KvEventsOptions& options);
  CacheStack() = default;
  // Queues `todo` for the SSD in order, half the spill queue at a time, until `deadline`, and
  // waits for the writes; counts refusals and cut-offs into `p`. Returns the hashes queued.
  std::vector<BlockHash> hand_to_ssd(std::span<const BlockRef> todo,
                                     std::chrono::steady_clock::time_point deadline, Persisted& p);

  std::shared_ptr<const KvLayout> layout_;
  std::shared_ptr<LayoutRegistry> layouts_;
  std::unique_ptr<GpuBlockPool> pool_;
  std::shared_ptr<GpuTier> gpu_;
  std::shared_ptr<RamTier> ram_;
  std::shared_ptr<StripedSsdTier> ssd_;
  std::shared_ptr<RemoteTier> remote_;
  std::unique_ptr<TieredCache> cache_;
  std::unique_ptr<KvEventPublisher> events_;
  const AdmissionPolicy* admission_ = nullptr;  // owned by cache_'s cascade; null: admit all
  uint64_t ssd_spill_queue_bytes_ = 0;
  std::chrono::milliseconds remote_drain_timeout_{10000};
  bool closed_ = false;
};

// Logs a persist_to_ssd() result once, as `who` ("shutdown", "close"): info when all was written,
// a warning naming what was not.
void log_persisted(std::string_view who, const CacheStack::Persisted& p);

}  // namespace kvtier
