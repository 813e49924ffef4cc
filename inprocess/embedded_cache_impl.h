// EmbeddedCache's insides, shared by its source files (embedded_cache.cc for host tensors,
// embedded_cache_cuda.cc for CUDA engines). Not part of the public API.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <optional>

#include <spdlog/spdlog.h>

#include "base/log.h"
#include "base/memory/large_buffer_cache.h"
#include "base/metrics/metrics.h"
#include "cache/cache_stack.h"
#include "cache/hybrid_prefix_cache.h"
#include "cache/plan/engine_planner.h"
#include "cache/prefix_hasher.h"
#include "cache/prefix_key_memo.h"
#include "engine/vulkan/vulkan_context.h"
#include "inprocess/cuda/device_transfers.h"
#include "inprocess/embedded_cache.h"

namespace kvtier {

// Extra keys are at most 256 bytes each.
Status check_extra_keys(std::span<const std::string> extra_keys);
// EmbeddedCacheOptions::hybrid_layout: JSON text ("{...") or a file holding it.
Result<HybridLayout> hybrid_layout_from(const std::string& text_or_path);

struct EmbeddedCacheMetrics {
  Counter rejected_calls;  // bad input: shape, dtype, token count, block ids, ...
  Counter stored_blocks;
  Counter already_cached;
  Counter refused_blocks;  // the cache would not take them (no room, collision)
  Counter loaded_blocks;
  Counter fetched_blocks;
  Counter bytes_in;
  Counter bytes_out;
  Counter cuda_failures;  // a CUDA transfer that failed for a reason other than bad input
  // The CUDA door's slower ways round (report_device_fallback), by the path given up.
  Counter cuda_fallback_slot_kernel;
  Counter cuda_fallback_read_in_place;
  Counter cuda_fallback_graph_capture;
};

// Shared by the cache and every FetchedBlocks it handed out, so pins can be given back (and views
// stay valid) after the EmbeddedCache itself is gone. Members are destroyed bottom-up: the stack
// before the Vulkan device it uses.
struct EmbeddedCache::Impl {
  std::unique_ptr<VulkanContext> vulkan;
  std::unique_ptr<CacheStack> stack;
  std::optional<PrefixHasher> hasher;
  // hasher->keys() of the last few prompts: a request's plan, load and lookup hash it once.
  std::optional<PrefixKeyMemo> key_memo;
  std::vector<BlockKey> prompt_keys(std::span<const uint32_t> tokens, std::span<const std::string> extra_keys) {
    return key_memo->keys(tokens, extra_keys);
  }
  std::unique_ptr<HybridPrefixCache> hybrid;  // a hybrid cache; goes before the stack it listens to
  EmbeddedCacheMetrics metrics;
  LogThrottle reject_log;
  EnginePlanner planner;

  TieredCache& cache() { return stack->cache(); }
  // The keys of `tokens`' full blocks a load may bring: all of them, or for a hybrid cache those
  // up to the last block with a snapshot (the blocks after it cannot be resumed from).
  std::vector<BlockKey> loadable_keys(std::span<const uint32_t> tokens, std::span<const std::string> extra_keys);
  // A hybrid call's checks: a hybrid cache, tokens a whole number of blocks (at least one).
  Status check_state_call(std::span<const uint32_t> tokens) const;
  const KvLayout& layout() const { return stack->layout(); }

  Status reject(Status st);
  // The host bytes of a fetched entry: device-tier blocks are copied down, quantized ones expanded.
  Result<BlockRef> host_block(const PinnedBlocks::Entry& e);
  Result<StoreResult> store(std::span<const uint32_t> tokens, const std::optional<BlockHash>& parent,
                            std::span<const LayerKv> layers, std::span<const std::string> extra_keys);
  Result<SaveReport> save_blocks(std::span<const uint32_t> tokens, std::span<const int64_t> block_ids,
                                 std::span<const LayerKv> paged, std::span<const std::string> extra_keys);
  Result<LoadReport> load_blocks(std::span<const uint32_t> tokens, std::span<const int64_t> block_ids,
                                 std::span<const LayerKv> paged, std::span<const std::string> extra_keys,
                                 const LoadOptions& options);
  // Loads blocks [options.first_block, end) of `keys` slice by slice, handing each to
  // put(block, index in the prompt); stops at the first block not cached, not intact, or not in
  // by the deadline.
  Result<LoadReport> load_range(std::span<const BlockKey> keys, size_t end, const LoadOptions& options,
                                const std::function<Status(const BlockRef&, size_t)>& put);
  // The identity of the block `tokens` after `parent`, in this cache's namespace.
  BlockIdentity identity(const BlockHash& parent, std::span<const uint32_t> tokens,
                         std::span<const std::string> extra_keys) const;
  // Inserts `block` unless the cache holds it; counts the outcome.
  Result<InsertOutcome> publish(Block block);
  bool holds(const BlockHash& hash, std::span<const uint32_t> tokens);
  // Counts a load of `loaded` blocks.
  void count_load(size_t loaded);
  // Teaches the planner a whole pure load that took `seconds` (see EmbeddedCache::observe_load).
  void time_load(const LoadReport& report, double seconds);
  // This door's counters, the cache's, every tier's, and the hybrid snapshots'.
  void visit_metrics(MetricVisitor& visitor);
  // Block ids must address blocks of the paged arrays.
  Status check_block_ids(std::span<const int64_t> ids, size_t used, int64_t num_blocks);

  // Counts and logs (throttled) a device call's failure that is not the caller's bad input (those
  // were counted as rejections).
  template <typename T>
  Result<T> device_outcome(Result<T> r) {
    const StatusCode code = r.ok() ? StatusCode::kOk : r.status().code();
    if (!r.ok() && code != StatusCode::kInvalidArgument && code != StatusCode::kFailedPrecondition) {
      metrics.cuda_failures.inc();
      device_log.warn("a CUDA transfer failed: {}", r.status().message());
    }
    return r;
  }
  LogThrottle device_log;

  // CUDA engines (embedded_cache_cuda.cc): the driver is loaded when the first CUDA transfer comes.
  Result<cuda::DeviceTransfers*> device_transfers();
  // Waits for uploads in flight and lets the host chunks be unregistered (close()).
  void close_device();
  // EmbeddedCacheOptions::cuda_device (a valid ordinal: open() checked it): the RAM budget's
  // chunks mapped, held and page-locked now.
  Status page_lock_ram(int device, uint64_t ram_capacity);
  std::vector<LargeBufferChunk> reserved;  // held by page_lock_ram until close_device
  std::mutex device_mu;  // guards device
  std::unique_ptr<cuda::DeviceTransfers> device;
};

// The blocks of `keys` that the cache holds, in order up to the first it does not, pinned (fetch()
// and pin_for_device()). Without `views`, only their hashes and bytes' addresses (a view per layer
// and part cost ~1 ms for 511 blocks of 32 layers). `located`: where the caller found them already
// (the fetch does not ask the tiers again).
std::shared_ptr<FetchedBlocks> fetch_keys(const std::shared_ptr<EmbeddedCache::Impl>& impl,
                                          std::span<const BlockKey> keys, bool views,
                                          const LookupResult* located = nullptr);

}  // namespace kvtier
