// EmbeddedCache: kvtier inside an inference engine's own process — the door that the Python
// module (`import kvtier`) and the C ABI (capi/kvtier.h) stand on. One cache serves one model (its
// KV layout) in one namespace, over the same CacheStack kvtierd runs, and hashes prompts exactly
// as kvtierd does: a block stored here is a hit over HTTP on the same directory, and back.
//
// Tensors come in as borrowed views (inprocess/tensor_view.h) and their bytes are copied unchanged:
// bf16 stays bf16. Blocks handed out by fetch() are views into the cached blocks themselves.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "cache/prefix_match.h"
#include "inprocess/tensor_view.h"
#include "serialize/block_hash.h"
#include "serialize/hybrid_layout.h"
#include "serialize/kv_layout.h"

namespace kvtier {

class MetricVisitor;

struct EmbeddedCacheOptions {
  std::string layout = "llama-3-8b";  // a preset, a layout JSON file, or layout JSON text ("{...")
  // A hybrid model's layout (serialize/hybrid_layout.h: JSON text "{..." or a file): replaces
  // `layout` with its attention layers' and adds GDN state snapshots beside the blocks; lookups,
  // loads and fetches then end at the last block with a snapshot.
  std::string hybrid_layout;
  std::string ns = "default";         // the namespace, as kvtierd's API names it (the model id)
  std::string hash = "sha256";        // or "xxh3"; must match the server's to share blocks
  uint64_t ram_capacity = 1ull << 30;
  // The RAM tier's policy: auto (adaptive for RAM alone, chain-lru above an SSD), chain-lru, lru,
  // s3fifo, s3fifo-chain, adaptive.
  std::string eviction = "auto";
  std::string ssd_admission = "all";   // which blocks leaving RAM reach the SSD: all, seen-twice
  uint64_t ssd_write_budget = 0;       // bytes a day the SSD tier may write (0: no budget)
  std::optional<int> kv_cache_quantization;  // 8 or 4: keep blocks quantized in RAM (group 64)
  std::vector<std::string> ssd_dirs;         // one per drive (the tier stripes over them); empty: no SSD tier
  uint64_t ssd_capacity = 64ull << 30;
  uint64_t ssd_segment_size = 256ull << 20;
  std::string compression = "none";          // SSD record codec: none, lz4, lz4-shuffle
  bool ssd_reset = false;
  uint64_t gpu_memory = 0;                   // > 0: a GPU tier (Vulkan) of this many bytes on top
  std::string remote;  // redis://[user:password@]host:port[,...]: a tier shared with other hosts
  // Block events for prefix-aware routers (kvtierd's --kv-events): a ZeroMQ endpoint to bind, and
  // optionally the replay socket's. Empty: none.
  std::string kv_events;
  std::string kv_events_replay;
  bool persist_on_close = true;  // close() writes what only RAM holds to the SSD, as kvtierd does
  // The CUDA device whose engine this cache serves: open() then maps the RAM tier's budget (and
  // an eighth more, for blocks in flight) and page-locks it before it returns. cuMemHostRegister
  // stalls every stream of the device while it runs (10-14 ms per 64 MiB chunk measured beside an
  // engine on the H200), so a cache that page-locks as it grows stalls the engine each time; one
  // that did it at open never does.
  std::optional<int> cuda_device;
  std::chrono::milliseconds close_timeout{30000};
};

// A prompt as the cache hashes it: its token ids, and the extra keys (a LoRA id, image hashes, a
// cache salt) folded into every block's hash, as vLLM's extra_keys are.
struct Prompt {
  std::span<const uint32_t> tokens;
  std::span<const std::string> extra_keys = {};
};

struct StoreResult {
  BlockHash hash;
  bool inserted = false;  // false: the cache already held this block
};

// Which part of a cached prefix to load, and until when. A caller that computes the prefix's first
// blocks while the rest loads (as kvtier's own generator plans a hit) asks from first_block on,
// with a deadline it can afford to wait until.
struct LoadOptions {
  size_t first_block = 0;  // blocks before it are the caller's to compute
  // Slices not in by then are not waited for: they finish loading in the background and are
  // dropped (unpinned). nullopt: wait however long it takes.
  std::optional<std::chrono::steady_clock::time_point> deadline;
};

// What a load brought: blocks [first_block, first_block + loaded_blocks) of the prompt, in order,
// intact. The caller computes from block first_block + loaded_blocks on.
struct LoadReport {
  size_t first_block = 0;
  size_t loaded_blocks = 0;
  bool deadline_passed = false;  // the cached run went on, but its next slice was not in time
  // The slowest tier (kvtier's, 0 = its top) a loaded block came from; -1 when none loaded. What
  // a timed load teaches the planner about (EmbeddedCache::observe_load).
  int source_tier = -1;
};

// How plan_prefill chooses: the split predicted fastest, or one end forced.
enum class PlanPolicy { kCost, kLoad, kCompute };
Result<PlanPolicy> parse_plan_policy(std::string_view name);  // "cost", "load", "compute"

// What plan_prefill says (cache/plan/engine_planner.h): compute blocks [0, compute_blocks) while
// [compute_blocks, cached_blocks) load, then the rest of the prompt. Seconds are predictions,
// nullopt where the planner does not know yet; `deadline` is seconds from the load's start to
// wait for it at most (nullopt: nothing loads, or no estimate).
struct PrefillPlan {
  size_t cached_blocks = 0;
  size_t compute_blocks = 0;
  std::optional<double> predicted, load_only, compute_only, load_seconds, deadline;
  bool probe = false;  // loads (or splits) against its own estimates, to time them again
  std::optional<double> overlap_alone;  // the planner's own, read back by observe_split
};

struct SaveReport {
  size_t stored = 0;          // new blocks
  size_t already_cached = 0;  // skipped without copying
  size_t refused = 0;         // no tier had room, or a collision (counted and logged by the cache)
};

// One block handed out by fetch(): read-only views into the block the cache holds.
struct FetchedBlock {
  BlockHash hash;
  std::string tier;  // where it was found
  std::vector<uint32_t> tokens;
  std::vector<LayerKv> layers;  // dense [block_size, kv_heads, head_dim] views, read_only
  // Per layer: the quantization the block was held in before it was dequantized (RAM or SSD).
  std::vector<std::optional<Quantization>> dequantized_from;
  const uint8_t* bytes = nullptr;  // the dense block (layer 0's K, its V, layer 1's K, ...)
};

// The result of fetch(). While it lives every view stays valid and its blocks stay pinned in the
// top tier; release_pins() lets them be evicted early (the views stay valid: the bytes are kept).
// Thread-safe.
class FetchedBlocks {
 public:
  struct State;
  FetchedBlocks(std::unique_ptr<State> state, std::vector<FetchedBlock> blocks);
  ~FetchedBlocks();
  const std::vector<FetchedBlock>& blocks() const { return blocks_; }
  size_t matched_tokens() const;
  void release_pins();

 private:
  std::unique_ptr<State> state_;
  std::vector<FetchedBlock> blocks_;
};

// A CUDA engine's side of a transfer (inprocess/cuda/). Blocks cross the bus by DMA between kvtier's
// host memory (page-locked where it lies) and dense staging buffers in the engine's device memory,
// on the engine's stream; the engine moves them between staging and its own layout with its own
// kernels (the Python module does it with torch), ordered on the same stream.
struct DeviceStaging {
  int device = 0;       // CUDA ordinal
  uint64_t stream = 0;  // a CUstream (cudaStream_t); 0 is the legacy default stream
  // Device addresses of staging buffers, each `slot_blocks` dense blocks one after another
  // (block_bytes() each). A save reads its blocks from slots[0]; a load fills them in turn, as a
  // ring.
  std::vector<uint64_t> slots;
  size_t slot_blocks = 0;
};
// The engine's half of a device transfer, called once per staging slot. A load calls it after the
// copies that fill `slot` with blocks [first, first + count) of the prompt were enqueued: the
// engine enqueues its scatter out of the slot behind them. A save calls it before enqueueing the
// copies out of `slot` of blocks [first, first + count) of its list: the engine enqueues its
// gather into the slot ahead of them. Either way the engine orders its own work on the slot
// against kvtier's stream, so the ring never comes back to a slot still in use.
using DeviceSlotHook = std::function<Status(size_t slot, size_t first, size_t count)>;

// Thread-safe: every method may be called from several threads at once. close() waits for calls
// in flight; afterwards every call fails with kFailedPrecondition ("the cache is closed").
class EmbeddedCache {
 public:
  static Result<std::unique_ptr<EmbeddedCache>> open(const EmbeddedCacheOptions& options);
  ~EmbeddedCache();  // close()
  EmbeddedCache(const EmbeddedCache&) = delete;
  EmbeddedCache& operator=(const EmbeddedCache&) = delete;

  const KvLayout& layout() const;
  // Set for a hybrid cache.
  const HybridLayout* hybrid_layout() const;
  // Where the block events are published and replayed, as bound (a "*" port resolved); nullopt
  // without kv_events.
  std::optional<std::pair<std::string, std::string>> kv_events_endpoints() const;
  const EmbeddedCacheOptions& options() const { return options_; }
  // Bytes of one dense block: every layer's K then V, [block_size, kv_heads, head_dim] each.
  size_t block_bytes() const;

  // The hashes of every full block of `tokens` (a partial last block has none).
  Result<std::vector<BlockHash>> block_hashes(const Prompt& prompt) const;
  // The longest cached prefix of `tokens`, block by block.
  Result<PrefixMatch> lookup(const Prompt& prompt);

  // Hit plans for an engine kvtier does not run (cache/plan/engine_planner.h): how many blocks of
  // the cached prefix of `tokens` to compute while the rest loads (load_blocks with first_block =
  // plan.hit.compute_blocks and deadline = plan.deadline). The prefix stops short of the prompt's
  // last token, which the engine computes whatever the plan. kCost plans a pure load until it
  // knows the engine's prefill (three observe_prefill samples) and a load's time per tier.
  Result<PrefillPlan> plan_prefill(const Prompt& prompt, PlanPolicy policy = PlanPolicy::kCost);
  // The engine computed `tokens` rows after `context` cached ones in `seconds`.
  Status observe_prefill(uint64_t tokens, uint64_t context, double seconds);
  // A load's bytes were in the engine's memory `seconds` after its call. Host loads are timed by
  // load_blocks itself; a CUDA load returns before its copies retire, so its door reports it.
  // Only a whole pure load teaches (first_block 0, no deadline passed, something loaded): a split's
  // load shares the machine with the front.
  Status observe_load(const LoadReport& report, double seconds);
  // A split plan's front and load, side by side, were both done `seconds` after the load began.
  Status observe_split(const PrefillPlan& plan, double seconds);

  // Stores one block: `tokens` (exactly block_size) whose parent is `parent` (nullopt for a
  // prompt's first block), from per-layer [block_size, kv_heads, head_dim] tensors or quantized
  // triples. Nothing is stored when any check fails.
  Result<StoreResult> store(const Prompt& prompt, const std::optional<BlockHash>& parent,
                            std::span<const LayerKv> layers);
  // The same from one dense block's bytes in block order (layer 0 K, layer 0 V, layer 1 K, ...).
  Result<StoreResult> store_bytes(const Prompt& prompt, const std::optional<BlockHash>& parent,
                                  std::span<const uint8_t> bytes);

  // Gathers the full blocks of `tokens` out of an engine's paged arrays: block i of the prompt is
  // in block id block_ids[i] of every layer's [num_blocks, block_size, kv_heads, head_dim] K and V
  // (or quantized triples). Blocks the cache holds already are skipped without a copy. Saves
  // min(full blocks, block_ids.size()) blocks.
  Result<SaveReport> save_blocks(const Prompt& prompt, std::span<const int64_t> block_ids,
                                 std::span<const LayerKv> paged);
  // Scatters the cached prefix of `tokens` into the engine's block ids (dense arrays; quantized
  // layers arrive dequantized). Returns the tokens loaded: a multiple of block_size, at most
  // block_ids.size() blocks. Blocks past the first that cannot be served intact are not loaded.
  Result<size_t> load_blocks(const Prompt& prompt, std::span<const int64_t> block_ids, std::span<const LayerKv> paged);
  // The same for part of the prefix: block i of the prompt (i >= options.first_block) into
  // block_ids[i] (entries before first_block are not read), stopping at options.deadline.
  Result<LoadReport> load_blocks(const Prompt& prompt, std::span<const int64_t> block_ids,
                                 std::span<const LayerKv> paged, const LoadOptions& options);
  // Blocks [first_block, first_block + max_blocks) of the cached prefix of `tokens`, dense, one
  // after another into `dst` (at least max_blocks * block_bytes()): for engines that place blocks
  // themselves (the C ABI).
  Result<LoadReport> load_prefix_bytes(const Prompt& prompt, const LoadOptions& options,
                                       size_t max_blocks, std::span<uint8_t> dst);

  // The cached prefix of `tokens` (at most `max_blocks`), promoted to the top tier and pinned.
  Result<std::shared_ptr<FetchedBlocks>> fetch(const Prompt& prompt, size_t max_blocks = SIZE_MAX);
  // A CUDA failure the engine's side of the door met on a thread of its own (waiting for a load's
  // event, say): counted in kvtier_embedded_cuda_failures_total and logged, as the door's own are.
  void report_device_failure(std::string_view what);
  // The engine's side of the door gave up a fast path and took a slower one that moves the same
  // bits: "slot_kernel" (Triton's slot kernel failed: torch's kernels), "read_in_place" (a
  // layerwise load copies instead), "graph_capture" (a slot's kernels launched one by one). Counted
  // in kvtier_embedded_cuda_fallbacks_total{path} and logged (throttled); another path is
  // kInvalidArgument.
  Status report_device_fallback(std::string_view path, std::string_view why);
  // Blocks [first_block, first_block + max_blocks) of the cached prefix, pinned where they lie in
  // host memory for CUDA device `device` to read in place (through unified addressing: kvtier's
  // chunks are page-locked and mapped). nullptr when one of them is not in memory or its memory
  // cannot be mapped: the caller copies them instead (load_device_blocks). Not counted as loaded
  // until the caller says its reads are queued (report_read_in_place): a caller whose first read
  // fails copies the blocks instead, and they would count twice.
  Result<std::shared_ptr<FetchedBlocks>> pin_for_device(const Prompt& prompt, size_t first_block,
                                                        size_t max_blocks, int device);
  // `blocks` pinned by pin_for_device are being read by the device: counted as loaded, and their
  // bytes as sent to the device.
  Status report_read_in_place(size_t blocks);
  // One block by hash into `dst` (block_bytes(), dense). With `tokens`, the held block's tokens
  // must equal them. False on a miss.
  Result<bool> load_block_bytes(const BlockHash& hash, std::span<const uint32_t> tokens,
                                std::span<uint8_t> dst);

  // CUDA engines. Checks an engine's paged K/V (CUDA views: shapes and strides only, the bytes
  // are not touched) as save_blocks (kRead) or load_blocks (kWrite) would, and that `block_ids`
  // address its blocks; returns the number of blocks. Counted as a rejected call when it fails.
  Result<int64_t> check_paged_layers(std::span<const LayerKv> paged, TensorAccess access,
                                     std::span<const int64_t> block_ids);
  // The block-id half of that check, for an engine whose tensors were checked before.
  Status check_block_ids(std::span<const int64_t> block_ids, int64_t num_blocks);
  // The indices (< max_blocks) of the full blocks of `tokens` the cache does not
  // hold: what a save has to stage.
  Result<std::vector<size_t>> missing_blocks(const Prompt& prompt, size_t max_blocks);
  // Saves blocks `indices` of `tokens`, staged by the engine through the ring `from` (a slot at a
  // time, `stage` called before each slot's copies; without `stage` they are all in slots[0]
  // already): copies them down on `from.stream`, waits for the copies, then publishes them.
  // unavailable() without a CUDA driver.
  Result<SaveReport> save_device_blocks(const Prompt& prompt, std::span<const size_t> indices,
                                        const DeviceStaging& from,
                                        const DeviceSlotHook& stage = {});
  // store() for one block staged at `from.slots[0]`.
  Result<StoreResult> store_device_block(const Prompt& prompt,
                                         const std::optional<BlockHash>& parent,
                                         const DeviceStaging& from);
  // Loads blocks [options.first_block, first_block + max_blocks) of the cached prefix into the
  // staging ring `to`, calling `filled` as each slot's copies are enqueued (and for the last,
  // partial one). Returns when everything is enqueued, not copied: the host blocks are kept alive
  // until the copies retire, and the engine's stream order does the rest.
  Result<LoadReport> load_device_blocks(const Prompt& prompt, const LoadOptions& options,
                                        size_t max_blocks, const DeviceStaging& to,
                                        const DeviceSlotHook& filled);

  // Hybrid caches. Stores the GDN state snapshot (hybrid_layout()->snapshot_bytes(): per GDN layer
  // its f32 state [heads, d_k, d_v] then its conv window [conv_channels, conv_width - 1]) taken
  // after `tokens`, whose length must be a whole number of blocks; true when it was new.
  Result<bool> store_state(const Prompt& prompt, std::span<const uint8_t> snapshot);
  // The same from the engine's tensors: per GDN layer a (state, conv window) pair of f32 views
  // (inprocess/state_tensors.h); every check made before anything is stored.
  Result<bool> store_state(const Prompt& prompt, std::span<const LayerKv> state);
  // The snapshot taken after `tokens` (a whole number of blocks), or nullopt when none is cached.
  Result<std::optional<std::vector<uint8_t>>> fetch_state(const Prompt& prompt);

  // Every metric (this door's, the cache's, every tier's) as JSON ({"name": [{labels, value}]})
  // and as Prometheus text.
  Result<std::string> stats_json() const;
  Result<std::string> metrics_text() const;

  // Writes what only RAM holds to the SSD (persist_on_close) and drains the spill queue, bounded
  // by close_timeout; returns the number of blocks that could not be written. Idempotent.
  size_t close();

  struct Impl;

 private:
  explicit EmbeddedCache(EmbeddedCacheOptions options);
  void visit_metrics(MetricVisitor& visitor) const;
  // A call in flight: holds state_mu_ shared, so close() (which takes it exclusively) waits for it.
  using Call = std::shared_lock<std::shared_mutex>;
  // Every call begins here: fails once the cache is closed, and with a prompt, refuses (and
  // counts) extra keys the hash cannot take before anything else is done.
  Result<Call> enter() const;
  Result<Call> enter(const Prompt& prompt) const;

  EmbeddedCacheOptions options_;
  std::shared_ptr<Impl> impl_;
  mutable std::shared_mutex state_mu_;  // guards closed_ against calls in flight
  bool closed_ = false;
};

}  // namespace kvtier
