// DeviceBlocks: a CUDA engine's blocks across the bus, between kvtier's host memory and the
// engine's staging buffers in device memory (inprocess/cuda/): each block crosses once, by DMA, as
// the contiguous bytes it is, on the engine's stream. A save publishes its blocks a group at a
// time once the group's copies have run (a reader never sees a block half-copied); a load returns
// once every copy is enqueued, keeping the host blocks alive until the copies retire. The
// arguments were checked by EmbeddedCache, whose call this runs inside.
#pragma once

#include <span>

#include "inprocess/embedded_cache.h"
#include "inprocess/embedded_cache_impl.h"

namespace kvtier {

class DeviceBlocks {
 public:
  explicit DeviceBlocks(EmbeddedCache::Impl& impl) : impl_(impl) {}

  // Blocks `indices` of the prompt (whose keys are `keys`), staged by the engine through `from`.
  Result<SaveReport> save(const Prompt& prompt, std::span<const BlockKey> keys, std::span<const size_t> indices,
                          const DeviceStaging& from, const DeviceSlotHook& stage);
  // The block `id`, staged at from.slots[0].
  Result<StoreResult> store(BlockIdentity id, const DeviceStaging& from);
  // Blocks [options.first_block, first_block + max_blocks) of the prompt's cached prefix into `to`.
  Result<LoadReport> load(const Prompt& prompt, const LoadOptions& options, size_t max_blocks,
                          const DeviceStaging& to, const DeviceSlotHook& filled);

 private:
  EmbeddedCache::Impl& impl_;
};

}  // namespace kvtier
