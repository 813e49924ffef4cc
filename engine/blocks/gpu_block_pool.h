// GpuBlockPool: one model's paged KV cache in GPU memory, with vLLM v1's block-pool semantics.
// Per layer, K and V arrays of num_blocks blocks [num_blocks, block_size, num_kv_heads, head_dim]
// in the layer's dtype. Free blocks wait in a queue, least recently used first; a block whose
// contents are published under a hash stays findable while it waits there (a cached block with
// reference count 0), until allocate() takes it for new contents — the moment it is evicted.
// Blocks in use (reference count > 0) are never handed out.
//
// The pool only keeps books: who copies an evicted block's bytes out before they are overwritten
// is its caller's business (GpuTier).
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "engine/attention/paged_kv.h"
#include "engine/blocks/block_hash_index.h"
#include "engine/blocks/free_order.h"
#include "engine/vulkan/gpu_buffer.h"
#include "serialize/block.h"
#include "serialize/block_events.h"
#include "serialize/kv_layout.h"

namespace kvtier {

struct GpuBlockPoolOptions {
  uint32_t num_blocks = 0;  // if 0, sized from byte_budget
  uint64_t byte_budget = 0;
};

// Thread-safe (one mutex over the books; the arrays themselves are the kernels' business).
class GpuBlockPool {
 public:
  static Result<std::unique_ptr<GpuBlockPool>> create(VulkanContext& ctx,
                                                      std::shared_ptr<const KvLayout> layout,
                                                      GpuBlockPoolOptions options);

  const KvLayout& layout() const { return *layout_; }
  const std::shared_ptr<const KvLayout>& layout_ptr() const { return layout_; }
  uint32_t num_blocks() const { return num_blocks_; }
  // All layers, K and V, of one block (the bytes a block moves to and from the host).
  uint64_t block_bytes() const { return layout_->dense_block_bytes(); }
  const PagedKvView& layer(int l) const { return views_[l]; }
  std::span<const PagedKvView> layers() const { return views_; }

  struct Evicted {
    int32_t id;
    BlockIdentity identity;
  };
  struct Allocation {
    std::vector<int32_t> ids;       // reference count 1 each
    std::vector<Evicted> evicted;   // cached blocks among `ids` whose contents must be saved first
  };
  // Takes n blocks, least recently used first. kResourceExhausted (nothing taken) when fewer
  // than n are free.
  Result<Allocation> allocate(uint32_t n);
  // The block cached under `hash`, or -1.
  int32_t find(const BlockHash& hash) const;
  // find() and ref() as one step (a free cached block cannot be taken in between), or -1.
  int32_t find_and_ref(const BlockHash& hash);
  // find() for many hashes under one lock.
  std::vector<bool> contains_many(std::span<const BlockHash> hashes) const;
  // find_and_ref() for many hashes under one lock (a GPU hit's prefix is thousands of blocks),
  // with whether each found block holds the expected token ids (an empty span matches any).
  struct Found {
    int32_t id = -1;  // -1: not cached
    bool same_tokens = false;
  };
  std::vector<Found> find_and_ref_many(std::span<const BlockHash> hashes,
                                       std::span<const std::span<const uint32_t>> tokens);
  // unref() for many blocks under one lock.
  void unref_many(std::span<const int32_t> ids);
  std::optional<BlockIdentity> identity(int32_t id) const;
  void ref(int32_t id);
  // At reference count 0 the block joins the free queue's most recent end.
  void unref(int32_t id);
  // Publishes block `id`'s contents under identity.hash. If that hash is already cached in another
  // block, nothing changes and that block's id is returned.
  std::optional<int32_t> cache(int32_t id, BlockIdentity identity);
  // cache(), unless `refuse(identity.hash)` says no: asked under the pool's lock, so an uncache()
  // of that hash is ordered with it. A refusal returns -1 and leaves block `id` uncached.
  std::optional<int32_t> cache(int32_t id, BlockIdentity identity,
                               const std::function<bool(const BlockHash&)>& refuse);
  // Forgets a cached hash (the block itself stays where it is). False when not cached.
  bool uncache(const BlockHash& hash);

  // Tells `sink` of every hash the pool starts or stops caching, under the pool's lock (so in the
  // order they happen). Call before the pool is shared.
  void set_events(std::shared_ptr<BlockEventSink> sink) { events_ = std::move(sink); }

  size_t cached_blocks() const;
  size_t free_blocks() const;
  size_t blocks_in_use() const;

 private:
  struct Slot {
    std::optional<BlockIdentity> identity;
  };
  GpuBlockPool() = default;
  // Whether cached block `id` holds `want` (empty: any), from the tokens' copy beside the others'.
  bool holds_tokens(int32_t id, std::span<const uint32_t> want) const;

  std::shared_ptr<const KvLayout> layout_;
  uint32_t num_blocks_ = 0;
  std::vector<GpuBuffer> arrays_;  // K0, V0, K1, V1, ...
  std::vector<PagedKvView> views_;

  mutable std::mutex mu_;  // guards everything below
  std::vector<Slot> slots_;
  // Reference counts, apart from the slots: a prompt's blocks are mostly neighbours, so a GPU hit's
  // pins walk a few lines of these, not a line per block.
  std::vector<int> refs_;
  // Each cached block's token ids again, block_size apiece side by side, where a GPU hit's check
  // of hundreds of blocks finds them without following each identity to its own allocation
  // (token_len_: how many the identity has; the copy is used when that is block_size).
  std::vector<uint32_t> tokens_;
  std::vector<uint32_t> token_len_;
  FreeOrder free_{0};  // the blocks with ref == 0, least recently used first
  BlockHashIndex by_hash_{0};
  std::shared_ptr<BlockEventSink> events_;
};

}  // namespace kvtier
