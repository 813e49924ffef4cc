#include "inprocess/embedded_cache.h"
#include "inprocess/embedded_cache_impl.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <functional>
#include <future>

#include <spdlog/spdlog.h>

#include "base/byte_size.h"
#include "base/elapsed.h"
#include "base/log.h"
#include "base/metrics/metrics_exporters.h"
#include "cache/cache_stack.h"
#include "cache/prefix_hasher.h"
#include "engine/vulkan/vulkan_context.h"
#include "inprocess/block_tensors.h"

namespace kvtier {

struct FetchedBlocks::State {
  std::shared_ptr<EmbeddedCache::Impl> impl;  // declared first: outlives the pins below
  std::mutex mu;                              // guards pinned
  PinnedBlocks pinned;
  std::vector<BlockRef> held;  // the bytes the views point into
  size_t block_size = 0;
};

FetchedBlocks::FetchedBlocks(std::unique_ptr<State> state, std::vector<FetchedBlock> blocks)
    : state_(std::move(state)), blocks_(std::move(blocks)) {}
FetchedBlocks::~FetchedBlocks() = default;

size_t FetchedBlocks::matched_tokens() const { return blocks_.size() * state_->block_size; }

void FetchedBlocks::release_pins() {
  std::lock_guard lock(state_->mu);
  state_->pinned.release();
}

namespace {

Result<KvLayout> layout_from(const std::string& text) {
  if (!text.empty() && text.front() == '{') return KvLayout::from_json_text(text);
  return resolve_layout(text);
}

Result<CacheStackOptions> stack_options(const EmbeddedCacheOptions& o,
                                        std::shared_ptr<const KvLayout> layout) {
  CacheStackOptions c;
  c.layout = layout;
  const uint64_t block = layout->dense_block_bytes();
  if (o.ram_capacity < 2 * block) {
    return invalid_argument("ram capacity " + format_byte_size(o.ram_capacity) +
                            " holds fewer than two blocks of layout '" + layout->name + "' (" +
                            format_byte_size(block) + " each)");
  }
  c.ram.capacity_bytes = o.ram_capacity;
  c.ram.eviction = o.eviction;
  c.ssd_admission = o.ssd_admission;
  if (o.ssd_write_budget > 0 && o.ssd_dirs.empty()) {
    return invalid_argument("ssd_write_budget: there is no SSD tier (ssd_dir) to budget");
  }
  c.ssd_write_budget = o.ssd_write_budget;
  if (o.kv_cache_quantization) {
    if (*o.kv_cache_quantization != 8 && *o.kv_cache_quantization != 4) {
      return invalid_argument("kv_cache_quantization must be 8 or 4 (bits), got " +
                              std::to_string(*o.kv_cache_quantization));
    }
    c.ram.quantization = Quantization{*o.kv_cache_quantization, 64};
    KVTIER_RETURN_IF_ERROR(validate_quantization(*c.ram.quantization, layout->head_dim)
                               .with_context("kv_cache_quantization"));
  }
  c.gpu_pool.byte_budget = o.gpu_memory;
  if (!o.kv_events_replay.empty() && o.kv_events.empty()) {
    return invalid_argument(
        "kv_events_replay needs kv_events (the endpoint whose batches it replays)");
  }
  if (!o.kv_events.empty()) {
    KvEventsOptions k;
    k.endpoint = o.kv_events;
    k.replay_endpoint = o.kv_events_replay;
    c.kv_events = std::move(k);
  }
  if (!o.remote.empty()) {
    auto address = RedisAddress::parse(o.remote);
    if (!address.ok()) return invalid_argument("remote: " + address.status().message());
    RemoteTierOptions r;
    r.address = std::move(address).value();
    c.remote = std::move(r);
  }
  if (!o.ssd_dirs.empty()) {
    if (o.ssd_capacity < 2 * o.ssd_segment_size * o.ssd_dirs.size()) {
      return invalid_argument("ssd capacity must hold at least two segments of " +
                              format_byte_size(o.ssd_segment_size) +
                              (o.ssd_dirs.size() > 1 ? " per directory" : ""));
    }
    if (o.ssd_segment_size < 2 * block + (1 << 20)) {
      return invalid_argument("ssd segment size " + format_byte_size(o.ssd_segment_size) +
                              " is too small for blocks of " + format_byte_size(block));
    }
    SsdTierOptions s;
    s.dir = o.ssd_dirs.front();
    s.dirs = o.ssd_dirs;
    s.capacity_bytes = o.ssd_capacity;
    s.segment_size = o.ssd_segment_size;
    KVTIER_ASSIGN_OR_RETURN(s.codec, parse_frame_codec(o.compression));
    s.reset = o.ssd_reset;
    s.drain_timeout = o.close_timeout;
    c.ssd = s;
  }
  return c;
}

// load_blocks reads a long prefix in slices of about this many bytes (a whole number of blocks):
// large enough for the SSD reader to batch, small enough that the copy of one slice overlaps the
// read of the next.
constexpr uint64_t kLoadSliceBytes = 32ull << 20;
constexpr size_t kLoadSlicesInFlight = 2;

}  // namespace

Status check_extra_keys(std::span<const std::string> extra_keys) {
  for (const std::string& k : extra_keys) {
    if (k.size() > 256) return invalid_argument("an extra key is longer than 256 bytes");
  }
  return ok_status();
}


Status EmbeddedCache::Impl::reject(Status st) {
  metrics.rejected_calls.inc();
  reject_log.warn("refused a call: {}", st.message());
  return st;
}

Result<BlockRef> EmbeddedCache::Impl::host_block(const PinnedBlocks::Entry& e) {
  BlockRef b = e.block;
  if (!b && stack->gpu()) {
    KVTIER_ASSIGN_OR_RETURN(b, stack->gpu()->read({e.hash, {}}));
  }
  if (!b) return internal_error("block " + e.hash.hex() + " has no host copy");
  if (b->any_quantized()) b = std::make_shared<const Block>(b->dequantized());
  return b;
}

BlockIdentity EmbeddedCache::Impl::identity(const BlockHash& parent, std::span<const uint32_t> tokens,
                                            std::span<const std::string> extra_keys) const {
  BlockIdentity id;
  id.parent_hash = parent;
  id.hash = hasher->hash_block(parent, tokens, extra_keys);
  id.token_ids.assign(tokens.begin(), tokens.end());
  id.namespace_id = hasher->ns().model_id;
  id.extra_keys.assign(extra_keys.begin(), extra_keys.end());
  return id;
}

bool EmbeddedCache::Impl::holds(const BlockHash& hash, std::span<const uint32_t> tokens) {
  const Tier::Presence p = cache().presence({hash, tokens});
  return p == Tier::Presence::kSameTokens || p == Tier::Presence::kUnverified;
}

Result<InsertOutcome> EmbeddedCache::Impl::publish(Block block) {
  metrics.bytes_in.inc(block.data().size());
  auto outcome = cache().insert(std::make_shared<const Block>(std::move(block)));
  if (!outcome.ok()) {
    metrics.refused_blocks.inc();  // logged by TieredCache with its reason
    return outcome.status();
  }
  (*outcome == InsertOutcome::kInserted ? metrics.stored_blocks : metrics.already_cached).inc();
  return outcome;
}

Result<StoreResult> EmbeddedCache::Impl::store(std::span<const uint32_t> tokens,
                                               const std::optional<BlockHash>& parent,
                                               std::span<const LayerKv> layers,
                                               std::span<const std::string> extra_keys) {
  const KvLayout& l = layout();
  if (static_cast<int>(tokens.size()) != l.block_size) {
    return reject(invalid_argument("a block holds " + std::to_string(l.block_size) + " tokens, got " +
                                   std::to_string(tokens.size())));
  }
  if (Status st = check_extra_keys(extra_keys); !st.ok()) return reject(st);
  if (auto n = check_layer_tensors(l, layers, BlockAddressing::kOneBlock, TensorAccess::kRead); !n.ok()) {
    return reject(n.status());
  }
  BlockIdentity id = identity(parent.value_or(hasher->root()), tokens, extra_keys);
  const BlockHash hash = id.hash;
  if (holds(hash, tokens)) {
    metrics.already_cached.inc();
    return StoreResult{hash, false};
  }
  KVTIER_ASSIGN_OR_RETURN(Block block, Block::with_forms(stack->layout_ptr(), std::move(id), forms_of(l, layers)));
  gather_block(layers, 0, block);
  KVTIER_ASSIGN_OR_RETURN(InsertOutcome outcome, publish(std::move(block)));
  return StoreResult{hash, outcome == InsertOutcome::kInserted};
}

Status EmbeddedCache::Impl::check_block_ids(std::span<const int64_t> ids, size_t used, int64_t num_blocks) {
  for (size_t i = 0; i < used; ++i) {
    if (ids[i] < 0 || ids[i] >= num_blocks) {
      return invalid_argument("block_ids[" + std::to_string(i) + "] = " + std::to_string(ids[i]) +
                              " is outside the paged arrays' " + std::to_string(num_blocks) + " blocks");
    }
  }
  // Two blocks of a prompt in one slot: a load would leave the later one there for both, a save
  // would store one slot's KV under two blocks' hashes.
  std::vector<int64_t> sorted(ids.begin(), ids.begin() + used);
  std::sort(sorted.begin(), sorted.end());
  if (auto dup = std::adjacent_find(sorted.begin(), sorted.end()); dup != sorted.end()) {
    return invalid_argument("block_ids names block " + std::to_string(*dup) +
                            " more than once: each block of a prompt needs a slot of its own");
  }
  return ok_status();
}

Result<SaveReport> EmbeddedCache::Impl::save_blocks(std::span<const uint32_t> tokens,
                                                    std::span<const int64_t> block_ids,
                                                    std::span<const LayerKv> paged,
                                                    std::span<const std::string> extra_keys) {
  if (Status st = check_extra_keys(extra_keys); !st.ok()) return reject(st);
  const KvLayout& l = layout();
  auto num_blocks = check_layer_tensors(l, paged, BlockAddressing::kPaged, TensorAccess::kRead);
  if (!num_blocks.ok()) return reject(num_blocks.status());
  const std::vector<BlockKey> keys = prompt_keys(tokens, extra_keys);
  const size_t n = std::min(keys.size(), block_ids.size());
  if (Status st = check_block_ids(block_ids, n, *num_blocks); !st.ok()) return reject(st);
  const Block::LayerForms forms = forms_of(l, paged);
  SaveReport report;
  for (size_t i = 0; i < n; ++i) {
    if (holds(keys[i].hash, keys[i].tokens)) {
      metrics.already_cached.inc();
      ++report.already_cached;
      continue;
    }
    BlockIdentity id = identity(i == 0 ? hasher->root() : keys[i - 1].hash, keys[i].tokens, extra_keys);
    KVTIER_ASSIGN_OR_RETURN(Block block, Block::with_forms(stack->layout_ptr(), std::move(id), forms));
    gather_block(paged, block_ids[i], block);
    auto outcome = publish(std::move(block));
    if (!outcome.ok()) ++report.refused;
    else if (*outcome == InsertOutcome::kInserted) ++report.stored;
    else ++report.already_cached;
  }
  return report;
}

Result<LoadReport> EmbeddedCache::Impl::load_blocks(std::span<const uint32_t> tokens,
                                                    std::span<const int64_t> block_ids,
                                                    std::span<const LayerKv> paged,
                                                    std::span<const std::string> extra_keys,
                                                    const LoadOptions& options) {
  if (Status st = check_extra_keys(extra_keys); !st.ok()) return reject(st);
  auto num_blocks = check_layer_tensors(layout(), paged, BlockAddressing::kPaged, TensorAccess::kWrite);
  if (!num_blocks.ok()) return reject(num_blocks.status());
  const std::vector<BlockKey> keys = loadable_keys(tokens, extra_keys);
  const size_t end = std::min(keys.size(), block_ids.size());
  if (options.first_block < end) {
    if (Status st = check_block_ids(block_ids.subspan(options.first_block), end - options.first_block, *num_blocks);
        !st.ok()) {
      return reject(st);
    }
  }
  const auto started = std::chrono::steady_clock::now();
  auto report = load_range(keys, end, options, [&](const BlockRef& b, size_t i) {
    return scatter_block(*b, paged, block_ids[i]);
  });
  if (report.ok()) time_load(*report, seconds_since(started));
  return report;
}

Result<LoadReport> EmbeddedCache::Impl::load_range(std::span<const BlockKey> keys, size_t end,
                                                   const LoadOptions& options,
                                                   const std::function<Status(const BlockRef&, size_t)>& put) {
  LoadReport report;
  report.first_block = options.first_block;
  if (options.first_block >= end) return report;
  const std::span<const BlockKey> wanted = keys.subspan(options.first_block, end - options.first_block);
  // Slice by slice, with kLoadSlicesInFlight slices being fetched (read off the SSD and verified
  // on the cache's loader threads) while the one before them is copied into the engine's arrays:
  // the disk always has a batch queued and the copies hide behind it. Hits in memory need no
  // I/O: they come back at once, in one slice.
  const Tier& top = *cache().tiers().front();
  const bool all_on_top = std::all_of(wanted.begin(), wanted.end(),
                                      [&](const BlockKey& k) { return top.contains(k.hash); });
  const size_t slice = all_on_top ? wanted.size() : std::max<size_t>(1, kLoadSliceBytes / layout().dense_block_bytes());
  const size_t slices = (wanted.size() + slice - 1) / slice;
  // Slices still loading when this call returns (a deadline passed, a prefix broke) finish on
  // the loader threads and unpin what they brought.
  std::deque<PendingFetch> in_flight;
  size_t issued = 0;
  auto issue = [&] {
    const size_t a = issued * slice;
    in_flight.push_back(cache().fetch_async(wanted.subspan(a, std::min(slice, wanted.size() - a))));
    ++issued;
  };
  while (issued < std::min(slices, kLoadSlicesInFlight)) issue();
  for (size_t s = 0; s < slices; ++s) {
    if (options.deadline && !in_flight.front().wait_until(*options.deadline)) {
      report.deadline_passed = true;
      break;
    }
    PinnedBlocks current = in_flight.front().wait();
    in_flight.pop_front();
    const bool whole = current.size() == std::min(slice, wanted.size() - s * slice);
    if (whole && issued < slices) issue();
    for (const PinnedBlocks::Entry& e : current.entries()) {
      auto b = host_block(e);
      if (!b.ok()) {  // counted by the tier that failed
        count_load(report.loaded_blocks);
        return report;
      }
      if (Status st = put(*b, options.first_block + report.loaded_blocks); !st.ok()) {
        count_load(report.loaded_blocks);  // those before it did reach the engine
        return st;
      }
      ++report.loaded_blocks;
      report.source_tier = std::max(report.source_tier, e.source_tier);
    }
    if (!whole) break;  // the prefix ends here
  }
  count_load(report.loaded_blocks);
  return report;
}

void EmbeddedCache::Impl::count_load(size_t loaded) {
  metrics.loaded_blocks.inc(loaded);
  metrics.bytes_out.inc(loaded * layout().dense_block_bytes());
}

EmbeddedCache::EmbeddedCache(EmbeddedCacheOptions options)
    : options_(std::move(options)), impl_(std::make_shared<Impl>()) {}

Result<std::unique_ptr<EmbeddedCache>> EmbeddedCache::open(const EmbeddedCacheOptions& o) {
  KVTIER_RETURN_IF_ERROR(check_namespace(o.ns));  // as kvtierd's doors check it
  std::optional<HybridLayout> hybrid;
  if (!o.hybrid_layout.empty()) {
    auto h = hybrid_layout_from(o.hybrid_layout);
    if (!h.ok()) {
      if (h.status().code() == StatusCode::kIoError) return h.status().with_context("hybrid_layout");
      return invalid_argument("hybrid_layout: " + h.status().message());
    }
    if (h->gdn_layers() == 0) return invalid_argument("hybrid_layout: no GDN layer (use layout)");
    hybrid = std::move(h).value();
  }
  auto layout = hybrid ? Result<KvLayout>(hybrid->attention()) : layout_from(o.layout);
  if (!layout.ok()) {
    // An unknown preset or a malformed layout is the caller's argument; only a file that exists
    // but cannot be read is an I/O error.
    if (layout.status().code() == StatusCode::kIoError) return layout.status().with_context("layout");
    return invalid_argument("layout: " + layout.status().message());
  }
  KVTIER_RETURN_IF_ERROR(layout->validate().with_context("layout"));
  auto shared_layout = std::make_shared<const KvLayout>(std::move(layout).value());
  auto hash = parse_hash_algorithm(o.hash);
  if (!hash.ok()) return hash.status().with_context("hash");
  KVTIER_ASSIGN_OR_RETURN(CacheStackOptions so, stack_options(o, shared_layout));
  if (o.cuda_device && *o.cuda_device < 0) {
    return invalid_argument("cuda_device: " + std::to_string(*o.cuda_device) +
                            " is not a CUDA ordinal");
  }
  if (o.cuda_device && o.kv_cache_quantization) {
    return invalid_argument(
        "cuda_device: page-locking ahead serves dense blocks; the RAM tier keeps quantized ones "
        "(kv_cache_quantization)");
  }

  std::unique_ptr<EmbeddedCache> c(new EmbeddedCache(o));
  Impl& impl = *c->impl_;
  if (o.gpu_memory > 0) {
    auto ctx = VulkanContext::create();
    if (!ctx.ok()) return ctx.status().with_context("a GPU tier needs a Vulkan device");
    impl.vulkan = std::move(ctx).value();
    so.vulkan = impl.vulkan.get();
  }
  KVTIER_ASSIGN_OR_RETURN(impl.stack, CacheStack::open(std::move(so)));
  // A hybrid model's blocks are named by its whole shape: it never shares one with a plain model
  // of the same attention layout.
  impl.hasher.emplace(*hash, Namespace{o.ns, hybrid ? hybrid->fingerprint() : shared_layout->fingerprint(), ""},
                      shared_layout->block_size);
  impl.key_memo.emplace(*impl.hasher);
  if (hybrid) {
    KVTIER_ASSIGN_OR_RETURN(impl.hybrid, HybridPrefixCache::create(impl.stack->cache(), *impl.hasher,
                                                                   std::move(*hybrid), impl.stack->layouts()));
  }
  if (o.cuda_device) {
    KVTIER_RETURN_IF_ERROR(
        impl.page_lock_ram(*o.cuda_device, o.ram_capacity).with_context("cuda_device"));
  }
  return c;
}

EmbeddedCache::~EmbeddedCache() { close(); }

const KvLayout& EmbeddedCache::layout() const { return impl_->layout(); }
size_t EmbeddedCache::block_bytes() const { return layout().dense_block_bytes(); }

Result<EmbeddedCache::Call> EmbeddedCache::enter() const {
  Call call(state_mu_);
  if (closed_) return failed_precondition("the cache is closed");
  return call;
}

Result<EmbeddedCache::Call> EmbeddedCache::enter(const Prompt& prompt) const {
  KVTIER_ASSIGN_OR_RETURN(Call call, enter());
  if (Status st = check_extra_keys(prompt.extra_keys); !st.ok()) return impl_->reject(st);
  return call;
}

Result<std::vector<BlockHash>> EmbeddedCache::block_hashes(const Prompt& prompt) const {
  KVTIER_ASSIGN_OR_RETURN(auto call, enter(prompt));
  return impl_->hasher->hash_prefix(prompt.tokens, prompt.extra_keys);
}

Result<StoreResult> EmbeddedCache::store(const Prompt& prompt,
                                         const std::optional<BlockHash>& parent,
                                         std::span<const LayerKv> layers) {
  KVTIER_ASSIGN_OR_RETURN(auto call, enter());
  return impl_->store(prompt.tokens, parent, layers, prompt.extra_keys);
}

Result<StoreResult> EmbeddedCache::store_bytes(const Prompt& prompt,
                                               const std::optional<BlockHash>& parent,
                                               std::span<const uint8_t> bytes) {
  KVTIER_ASSIGN_OR_RETURN(auto call, enter());
  if (bytes.size() != block_bytes()) {
    return impl_->reject(invalid_argument("a block of layout '" + layout().name + "' is " +
                                          std::to_string(block_bytes()) + " bytes, got " +
                                          std::to_string(bytes.size())));
  }
  const std::vector<LayerKv> views = dense_block_views(layout(), bytes.data(), /*read_only=*/true);
  return impl_->store(prompt.tokens, parent, views, prompt.extra_keys);
}

Result<SaveReport> EmbeddedCache::save_blocks(const Prompt& prompt,
                                              std::span<const int64_t> block_ids,
                                              std::span<const LayerKv> paged) {
  KVTIER_ASSIGN_OR_RETURN(auto call, enter());
  return impl_->save_blocks(prompt.tokens, block_ids, paged, prompt.extra_keys);
}

Result<size_t> EmbeddedCache::load_blocks(const Prompt& prompt, std::span<const int64_t> block_ids,
                                          std::span<const LayerKv> paged) {
  KVTIER_ASSIGN_OR_RETURN(LoadReport r, load_blocks(prompt, block_ids, paged, LoadOptions{}));
  return r.loaded_blocks * static_cast<size_t>(layout().block_size);
}

Result<LoadReport> EmbeddedCache::load_blocks(const Prompt& prompt,
                                              std::span<const int64_t> block_ids,
                                              std::span<const LayerKv> paged,
                                              const LoadOptions& options) {
  KVTIER_ASSIGN_OR_RETURN(auto call, enter());
  return impl_->load_blocks(prompt.tokens, block_ids, paged, prompt.extra_keys, options);
}

Result<LoadReport> EmbeddedCache::load_prefix_bytes(const Prompt& prompt,
                                                    const LoadOptions& options, size_t max_blocks,
                                                    std::span<uint8_t> dst) {
  KVTIER_ASSIGN_OR_RETURN(auto call, enter(prompt));
  const size_t bb = block_bytes();
  if (max_blocks > dst.size() / bb) {
    return impl_->reject(invalid_argument(std::to_string(max_blocks) + " blocks of " + std::to_string(bb) +
                                          " bytes do not fit a buffer of " + std::to_string(dst.size())));
  }
  const std::vector<BlockKey> keys = impl_->loadable_keys(prompt.tokens, prompt.extra_keys);
  const size_t end = options.first_block +
                     std::min(max_blocks, keys.size() - std::min(keys.size(), options.first_block));
  const auto started = std::chrono::steady_clock::now();
  auto report = impl_->load_range(keys, end, options, [&](const BlockRef& b, size_t i) {
    const std::vector<LayerKv> views =
        dense_block_views(layout(), dst.data() + (i - options.first_block) * bb, /*read_only=*/false);
    return scatter_block(*b, views, 0);
  });
  if (report.ok()) impl_->time_load(*report, seconds_since(started));
  return report;
}

Result<std::shared_ptr<FetchedBlocks>> EmbeddedCache::fetch(const Prompt& prompt, size_t max_blocks) {
  KVTIER_ASSIGN_OR_RETURN(auto call, enter(prompt));
  std::vector<BlockKey> keys = impl_->loadable_keys(prompt.tokens, prompt.extra_keys);
  if (keys.size() > max_blocks) keys.resize(max_blocks);
  auto fetched = fetch_keys(impl_, keys, /*views=*/true);
  impl_->metrics.fetched_blocks.inc(fetched->blocks().size());
  return fetched;
}

std::shared_ptr<FetchedBlocks> fetch_keys(const std::shared_ptr<EmbeddedCache::Impl>& impl,
                                          std::span<const BlockKey> keys, bool views,
                                          const LookupResult* located) {
  auto state = std::make_unique<FetchedBlocks::State>();
  state->impl = impl;
  state->block_size = static_cast<size_t>(impl->layout().block_size);
  state->pinned = located ? impl->cache().fetch(keys, *located) : impl->cache().fetch(keys);
  std::vector<FetchedBlock> blocks;
  blocks.reserve(state->pinned.entries().size());
  state->held.reserve(state->pinned.entries().size());
  for (const PinnedBlocks::Entry& e : state->pinned.entries()) {
    auto b = impl->host_block(e);
    if (!b.ok()) break;  // counted by the GPU tier; the prefix ends here
    const Block& block = **b;
    FetchedBlock f;
    f.hash = e.hash;
    f.bytes = block.data().data();
    if (views) {
      f.tier = std::string(impl->cache().tiers()[e.source_tier]->name());
      f.tokens = block.identity().token_ids;
      f.layers = dense_block_views(block.layout(), block.data().data(), /*read_only=*/true);
      for (int l = 0; l < block.layout().num_layers; ++l)
        f.dequantized_from.push_back(block.dequantized_from(l));
    }
    state->held.push_back(std::move(b).value());
    blocks.push_back(std::move(f));
  }
  return std::make_shared<FetchedBlocks>(std::move(state), std::move(blocks));
}

Result<bool> EmbeddedCache::load_block_bytes(const BlockHash& hash, std::span<const uint32_t> tokens,
                                             std::span<uint8_t> dst) {
  KVTIER_ASSIGN_OR_RETURN(auto call, enter());
  if (dst.size() != block_bytes()) {
    return impl_->reject(invalid_argument("a block of layout '" + layout().name + "' is " +
                                          std::to_string(block_bytes()) + " bytes, the buffer " +
                                          std::to_string(dst.size())));
  }
  if (!tokens.empty() && static_cast<int>(tokens.size()) != layout().block_size) {
    return impl_->reject(invalid_argument("a block holds " + std::to_string(layout().block_size) +
                                          " tokens, got " + std::to_string(tokens.size())));
  }
  const BlockKey key{hash, tokens};
  PinnedBlocks pinned = impl_->cache().fetch(std::span(&key, 1));
  if (pinned.size() == 0) return false;
  KVTIER_ASSIGN_OR_RETURN(BlockRef b, impl_->host_block(pinned.entries().front()));
  const std::vector<LayerKv> views = dense_block_views(layout(), dst.data(), /*read_only=*/false);
  KVTIER_RETURN_IF_ERROR(scatter_block(*b, views, 0));
  impl_->metrics.loaded_blocks.inc();
  impl_->metrics.bytes_out.inc(dst.size());
  return true;
}

void EmbeddedCache::visit_metrics(MetricVisitor& v) const { impl_->visit_metrics(v); }

std::optional<std::pair<std::string, std::string>> EmbeddedCache::kv_events_endpoints() const {
  const KvEventPublisher* events = impl_->stack->kv_events();
  if (!events) return std::nullopt;
  return std::pair{events->endpoint(), events->replay_endpoint()};
}

size_t EmbeddedCache::close() {
  std::unique_lock lock(state_mu_);  // waits for calls in flight
  if (closed_) return 0;
  closed_ = true;
  if (!impl_->stack) return 0;  // open() failed before the tiers were up
  CacheStack& stack = *impl_->stack;
  size_t lost = 0;
  const auto deadline = std::chrono::steady_clock::now() + options_.close_timeout;
  if (options_.persist_on_close && stack.ssd()) {
    const CacheStack::Persisted p = stack.persist_to_ssd(deadline);
    lost += p.not_kept();
    log_persisted("close", p);
  }
  impl_->close_device();
  return lost + stack.close().ssd;
}

}  // namespace kvtier
