// EmbeddedCache for CUDA engines: the calls' checks; the moving is DeviceBlocks'. The engine's own
// layout is its business (the Python module gathers and scatters with torch).
#include <algorithm>
#include <chrono>

#include <spdlog/spdlog.h>

#include "base/byte_size.h"
#include "base/memory/large_buffer_cache.h"
#include "inprocess/block_tensors.h"
#include "inprocess/cuda/cuda_host_pinning.h"
#include "inprocess/device_blocks.h"
#include "inprocess/embedded_cache.h"
#include "inprocess/embedded_cache_impl.h"

namespace kvtier {
namespace {

Status check_staging(const DeviceStaging& s, size_t blocks_needed, bool ring) {
  if (s.device < 0) return invalid_argument("device " + std::to_string(s.device) + " is not a CUDA ordinal");
  if (s.slots.empty() || s.slot_blocks == 0) return invalid_argument("no staging buffer");
  for (uint64_t p : s.slots) {
    if (p == 0) return invalid_argument("a staging buffer's address is null");
  }
  if (!ring && s.slot_blocks < blocks_needed) {
    return invalid_argument("the staging buffer holds " + std::to_string(s.slot_blocks) + " blocks, " +
                            std::to_string(blocks_needed) + " are to be saved");
  }
  return ok_status();
}

}  // namespace

Result<cuda::DeviceTransfers*> EmbeddedCache::Impl::device_transfers() {
  std::lock_guard lock(device_mu);
  if (!device) {
    auto created = cuda::DeviceTransfers::create();
    if (!created.ok()) return created.status().with_context("CUDA tensors need the CUDA driver");
    device = std::move(created).value();
  }
  return device.get();
}

void EmbeddedCache::Impl::close_device() {
  std::unique_ptr<cuda::DeviceTransfers> d;
  std::vector<LargeBufferChunk> held;
  {
    std::lock_guard lock(device_mu);
    d = std::move(device);
    held.swap(reserved);
  }
  d.reset();  // waits for uploads in flight
  for (const LargeBufferChunk& c : held) large_buffer_unhold_chunk(c.base);
}

Status EmbeddedCache::Impl::page_lock_ram(int device, uint64_t ram_capacity) {
  const size_t bb = layout().dense_block_bytes();
  KVTIER_ASSIGN_OR_RETURN(cuda::DeviceTransfers * d, device_transfers());
  // The budget and an eighth (at least 256 MiB): a save allocates its blocks before the tier
  // evicts for them, and a load still reads blocks the tier has let go. Beside an engine on the
  // H200 host a 1.5 GiB budget with nothing over it mapped two more chunks while it filled, and
  // their registrations stalled the engine for 10 and 19 ms.
  const uint64_t headroom = std::max<uint64_t>(ram_capacity / 8, 256ull << 20);
  auto held = large_buffer_reserve(bb, (ram_capacity + headroom) / bb);
  if (!held) {
    return resource_exhausted("could not map " + format_byte_size(ram_capacity + headroom) +
                              " of host memory for the RAM tier (its budget and an eighth)");
  }
  {
    std::lock_guard lock(device_mu);
    reserved.insert(reserved.end(), held->begin(), held->end());
  }
  // Starts the registering thread, which takes every chunk mapped so far, these included.
  KVTIER_ASSIGN_OR_RETURN(cuda::ScopedDeviceContext ctx, d->enter(device));
  const auto started = std::chrono::steady_clock::now();
  cuda::CudaHostPinning::instance().wait_queued();
  spdlog::info("cuda: {} of host memory page-locked for device {} in {:.0f} ms",
               format_byte_size(cuda::CudaHostPinning::instance().registered_bytes()), device,
               std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started)
                   .count());
  return ok_status();
}

Result<int64_t> EmbeddedCache::check_paged_layers(std::span<const LayerKv> paged, TensorAccess access,
                                                 std::span<const int64_t> block_ids) {
  KVTIER_ASSIGN_OR_RETURN(auto call, enter());
  auto n = check_layer_tensors(layout(), paged, BlockAddressing::kPaged, access);
  if (!n.ok()) return impl_->reject(n.status());
  for (const LayerKv& l : paged) {
    if (l.k.quantized() || l.v.quantized()) {
      return impl_->reject(invalid_argument("quantized layers are taken from host tensors only, not CUDA ones"));
    }
  }
  if (Status st = impl_->check_block_ids(block_ids, block_ids.size(), *n); !st.ok()) return impl_->reject(st);
  return n;
}

Status EmbeddedCache::check_block_ids(std::span<const int64_t> block_ids, int64_t num_blocks) {
  KVTIER_ASSIGN_OR_RETURN(auto call, enter());
  if (Status st = impl_->check_block_ids(block_ids, block_ids.size(), num_blocks); !st.ok()) return impl_->reject(st);
  return ok_status();
}

Result<std::vector<size_t>> EmbeddedCache::missing_blocks(const Prompt& prompt, size_t max_blocks) {
  KVTIER_ASSIGN_OR_RETURN(auto call, enter(prompt));
  const std::vector<BlockKey> keys = impl_->prompt_keys(prompt.tokens, prompt.extra_keys);
  std::vector<size_t> out;
  for (size_t i = 0; i < std::min(keys.size(), max_blocks); ++i) {
    if (!impl_->holds(keys[i].hash, keys[i].tokens)) out.push_back(i);
  }
  return out;
}

Result<SaveReport> EmbeddedCache::save_device_blocks(const Prompt& prompt,
                                                     std::span<const size_t> indices,
                                                     const DeviceStaging& from,
                                                     const DeviceSlotHook& stage) {
  return impl_->device_outcome([&]() -> Result<SaveReport> {
    KVTIER_ASSIGN_OR_RETURN(auto call, enter(prompt));
    if (Status st = check_staging(from, indices.size(), /*ring=*/static_cast<bool>(stage)); !st.ok()) {
      return impl_->reject(st);
    }
    const std::vector<BlockKey> keys = impl_->prompt_keys(prompt.tokens, prompt.extra_keys);
    for (size_t j = 0; j < indices.size(); ++j) {
      if (indices[j] >= keys.size()) {
        return impl_->reject(invalid_argument("block " + std::to_string(indices[j]) + " is past the prompt's " +
                                              std::to_string(keys.size()) + " full blocks"));
      }
    }
    return DeviceBlocks(*impl_).save(prompt, keys, indices, from, stage);
  }());
}

Result<StoreResult> EmbeddedCache::store_device_block(const Prompt& prompt,
                                                      const std::optional<BlockHash>& parent,
                                                      const DeviceStaging& from) {
  return impl_->device_outcome([&]() -> Result<StoreResult> {
    KVTIER_ASSIGN_OR_RETURN(auto call, enter());
    const KvLayout& l = layout();
    if (static_cast<int>(prompt.tokens.size()) != l.block_size) {
      return impl_->reject(invalid_argument("a block holds " + std::to_string(l.block_size) + " tokens, got " +
                                            std::to_string(prompt.tokens.size())));
    }
    if (Status st = check_extra_keys(prompt.extra_keys); !st.ok()) return impl_->reject(st);
    if (Status st = check_staging(from, 1, /*ring=*/false); !st.ok()) return impl_->reject(st);
    BlockIdentity id = impl_->identity(parent.value_or(impl_->hasher->root()), prompt.tokens, prompt.extra_keys);
    const BlockHash hash = id.hash;
    if (impl_->holds(hash, prompt.tokens)) {
      impl_->metrics.already_cached.inc();
      return StoreResult{hash, false};
    }
    return DeviceBlocks(*impl_).store(std::move(id), from);
  }());
}

Result<LoadReport> EmbeddedCache::load_device_blocks(const Prompt& prompt,
                                                     const LoadOptions& options, size_t max_blocks,
                                                     const DeviceStaging& to,
                                                     const DeviceSlotHook& filled) {
  return impl_->device_outcome([&]() -> Result<LoadReport> {
    KVTIER_ASSIGN_OR_RETURN(auto call, enter(prompt));
    if (Status st = check_staging(to, 0, /*ring=*/true); !st.ok()) return impl_->reject(st);
    return DeviceBlocks(*impl_).load(prompt, options, max_blocks, to, filled);
  }());
}

void EmbeddedCache::report_device_failure(std::string_view what) {
  impl_->metrics.cuda_failures.inc();
  impl_->device_log.warn("a CUDA transfer failed: {}", what);
}

Status EmbeddedCache::report_device_fallback(std::string_view path, std::string_view why) {
  Counter* c = path == "slot_kernel"     ? &impl_->metrics.cuda_fallback_slot_kernel
               : path == "read_in_place" ? &impl_->metrics.cuda_fallback_read_in_place
               : path == "graph_capture" ? &impl_->metrics.cuda_fallback_graph_capture
                                         : nullptr;
  if (c == nullptr) {
    return invalid_argument("unknown CUDA fallback path '" + std::string(path) +
                            "' (slot_kernel, read_in_place, graph_capture)");
  }
  c->inc();
  impl_->device_log.warn("CUDA door: {} given up for a slower path: {}", path, why);
  return ok_status();
}

Result<std::shared_ptr<FetchedBlocks>> EmbeddedCache::pin_for_device(const Prompt& prompt,
                                                                     size_t first_block,
                                                                     size_t max_blocks,
                                                                     int device) {
  return impl_->device_outcome([&]() -> Result<std::shared_ptr<FetchedBlocks>> {
    KVTIER_ASSIGN_OR_RETURN(auto call, enter(prompt));
    if (device < 0)
      return impl_->reject(
          invalid_argument("device " + std::to_string(device) + " is not a CUDA ordinal"));
    const std::vector<BlockKey> keys = impl_->loadable_keys(prompt.tokens, prompt.extra_keys);
    const size_t first = std::min(first_block, keys.size());
    std::span<const BlockKey> wanted =
        std::span(keys).subspan(first, std::min(max_blocks, keys.size() - first));
    // Only a prefix all in memory: one on the SSD would be read here, on the engine's time, where
    // the copying load reads it ahead of its copies. The cached prefix may end in memory. Asked
    // in one batch (one lock), and the answer is the fetch's: it does not locate the blocks again.
    const auto& tiers = impl_->cache().tiers();
    std::vector<BlockHash> hashes;
    hashes.reserve(wanted.size());
    for (const BlockKey& k : wanted) hashes.push_back(k.hash);
    const std::vector<bool> in_memory = tiers.front()->contains_many(hashes);
    LookupResult located;
    for (size_t i = 0; i < wanted.size() && in_memory[i]; ++i)
      located.blocks.push_back({wanted[i].hash, 0});
    if (located.blocks.size() < wanted.size()) {
      const BlockHash& next = wanted[located.blocks.size()].hash;
      if (std::any_of(tiers.begin() + 1, tiers.end(),
                      [&](const auto& t) { return t->contains(next); }))
        return std::shared_ptr<FetchedBlocks>();
      wanted = wanted.first(located.blocks.size());
    }
    KVTIER_ASSIGN_OR_RETURN(cuda::DeviceTransfers * d, impl_->device_transfers());
    KVTIER_ASSIGN_OR_RETURN(cuda::ScopedDeviceContext ctx, d->enter(device));
    std::shared_ptr<FetchedBlocks> fetched = fetch_keys(impl_, wanted, /*views=*/false, &located);
    const size_t bb = layout().dense_block_bytes();
    // Asked once per chunk, not per block: a prompt's blocks share a few dozen chunks, and every
    // ask takes the registry's lock on the path to the engine's first kernel.
    const uint8_t* mapped_from = nullptr;
    const uint8_t* mapped_to = nullptr;
    for (const FetchedBlock& b : fetched->blocks()) {
      if (b.bytes >= mapped_from && b.bytes + bb <= mapped_to) continue;
      if (!d->mapped(b.bytes, bb)) return std::shared_ptr<FetchedBlocks>();  // the pins go with it
      const LargeBufferChunk chunk = large_buffer_chunk(b.bytes);
      mapped_from = chunk.base;
      mapped_to = chunk.base + chunk.bytes;
    }
    return fetched;
  }());
}

Status EmbeddedCache::report_read_in_place(size_t blocks) {
  KVTIER_ASSIGN_OR_RETURN(auto call, enter());
  KVTIER_ASSIGN_OR_RETURN(cuda::DeviceTransfers * d, impl_->device_transfers());
  impl_->count_load(blocks);
  d->count_read_in_place(blocks * layout().dense_block_bytes());
  return ok_status();
}

}  // namespace kvtier
