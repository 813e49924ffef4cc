#include "engine/blocks/gpu_block_pool.h"

#include <algorithm>
#include <cassert>

#include "base/byte_size.h"

namespace kvtier {

Result<std::unique_ptr<GpuBlockPool>> GpuBlockPool::create(VulkanContext& ctx,
                                                           std::shared_ptr<const KvLayout> layout,
                                                           GpuBlockPoolOptions options) {
  KVTIER_RETURN_IF_ERROR(layout->validate());
  for (const LayerSpec& s : layout->layers) {
    if (s.quantization) {
      return invalid_argument("GPU block pool: layers are held dense; quantized layouts are a "
                              "RAM-tier option, not a GPU one");
    }
  }
  std::unique_ptr<GpuBlockPool> p(new GpuBlockPool());
  p->layout_ = std::move(layout);
  p->num_blocks_ = options.num_blocks;
  if (p->num_blocks_ == 0) p->num_blocks_ = static_cast<uint32_t>(options.byte_budget / p->block_bytes());
  if (p->num_blocks_ == 0) {
    return invalid_argument("GPU block pool: a budget of " + format_byte_size(options.byte_budget) +
                            " holds no block of " + format_byte_size(p->block_bytes()));
  }
  const KvLayout& l = *p->layout_;
  for (int layer = 0; layer < l.num_layers; ++layer) {
    const uint64_t bytes = static_cast<uint64_t>(p->num_blocks_) * l.dense_tensor_bytes(layer);
    for (int part = 0; part < 2; ++part) {
      KVTIER_ASSIGN_OR_RETURN(GpuBuffer b, GpuBuffer::create(ctx, bytes, MemoryKind::kDevice));
      p->arrays_.push_back(std::move(b));
    }
    p->views_.push_back({p->arrays_[2 * layer].address(), p->arrays_[2 * layer + 1].address(),
                         p->num_blocks_, static_cast<uint32_t>(l.block_size),
                         static_cast<uint32_t>(l.num_kv_heads), static_cast<uint32_t>(l.head_dim),
                         l.layers[layer].dtype});
  }
  p->slots_.resize(p->num_blocks_);
  p->refs_.assign(p->num_blocks_, 0);
  p->by_hash_ = BlockHashIndex(p->num_blocks_);
  p->tokens_.resize(static_cast<size_t>(p->num_blocks_) * l.block_size);
  p->token_len_.resize(p->num_blocks_);
  p->free_ = FreeOrder(p->num_blocks_);
  for (int32_t id = 0; id < static_cast<int32_t>(p->num_blocks_); ++id) p->free_.push_back(id);
  return p;
}

Result<GpuBlockPool::Allocation> GpuBlockPool::allocate(uint32_t n) {
  std::lock_guard lock(mu_);
  if (free_.size() < n) {
    return resource_exhausted("GPU block pool: " + std::to_string(n) + " blocks wanted, " +
                              std::to_string(free_.size()) + " free of " + std::to_string(num_blocks_));
  }
  Allocation a;
  for (uint32_t i = 0; i < n; ++i) {
    const int32_t id = free_.front();
    free_.pop_front();
    Slot& s = slots_[id];
    refs_[id] = 1;
    if (s.identity) {
      by_hash_.erase(s.identity->hash);
      if (events_) events_->removed(s.identity->hash);
      a.evicted.push_back({id, std::move(*s.identity)});
      s.identity.reset();
    }
    a.ids.push_back(id);
  }
  return a;
}

int32_t GpuBlockPool::find(const BlockHash& hash) const {
  std::lock_guard lock(mu_);
  return by_hash_.find(hash);
}

int32_t GpuBlockPool::find_and_ref(const BlockHash& hash) {
  std::lock_guard lock(mu_);
  const int32_t id = by_hash_.find(hash);
  if (id < 0) return -1;
  if (refs_[id]++ == 0) free_.erase(id);
  return id;
}

// How many entries ahead a walk over a prefix starts its next loads: enough to cover a miss to
// memory with the work of the entries in between.
constexpr size_t kPrefetchAhead = 8;

bool GpuBlockPool::holds_tokens(int32_t id, std::span<const uint32_t> want) const {
  if (want.empty()) return true;
  const size_t bs = static_cast<size_t>(layout_->block_size);
  if (token_len_[id] == bs) {
    return want.size() == bs && std::equal(want.begin(), want.end(),
                                           tokens_.begin() + static_cast<std::ptrdiff_t>(id * bs));
  }
  const std::vector<uint32_t>& held = slots_[id].identity->token_ids;
  return std::equal(held.begin(), held.end(), want.begin(), want.end());
}

std::vector<bool> GpuBlockPool::contains_many(std::span<const BlockHash> hashes) const {
  std::vector<bool> out(hashes.size());
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < std::min(kPrefetchAhead, hashes.size()); ++i) by_hash_.prefetch(hashes[i]);
  for (size_t i = 0; i < hashes.size(); ++i) {
    if (i + kPrefetchAhead < hashes.size()) by_hash_.prefetch(hashes[i + kPrefetchAhead]);
    out[i] = by_hash_.find(hashes[i]) >= 0;
  }
  return out;
}

std::vector<GpuBlockPool::Found> GpuBlockPool::find_and_ref_many(std::span<const BlockHash> hashes,
                                                                 std::span<const std::span<const uint32_t>> tokens) {
  std::vector<Found> out(hashes.size());
  std::lock_guard lock(mu_);
  // Two walks, each starting its loads ahead: the ids first, then each block's count and tokens.
  const size_t bs = static_cast<size_t>(layout_->block_size);
  for (size_t i = 0; i < std::min(kPrefetchAhead, hashes.size()); ++i) by_hash_.prefetch(hashes[i]);
  for (size_t i = 0; i < hashes.size(); ++i) {
    if (i + kPrefetchAhead < hashes.size()) by_hash_.prefetch(hashes[i + kPrefetchAhead]);
    out[i].id = by_hash_.find(hashes[i]);
  }
  auto prefetch_block = [&](int32_t id) {
    __builtin_prefetch(&refs_[id]);
    __builtin_prefetch(&tokens_[id * bs]);
  };
  for (size_t i = 0; i < std::min(kPrefetchAhead, out.size()); ++i) {
    if (out[i].id >= 0) prefetch_block(out[i].id);
  }
  for (size_t i = 0; i < hashes.size(); ++i) {
    if (i + kPrefetchAhead < out.size() && out[i + kPrefetchAhead].id >= 0)
      prefetch_block(out[i + kPrefetchAhead].id);
    const int32_t id = out[i].id;
    if (id < 0) continue;
    if (refs_[id]++ == 0) free_.erase(id);
    // Found under a hash: cached, so it has an identity.
    out[i].same_tokens =
        holds_tokens(id, i < tokens.size() ? tokens[i] : std::span<const uint32_t>());
  }
  return out;
}

void GpuBlockPool::unref_many(std::span<const int32_t> ids) {
  std::lock_guard lock(mu_);
  for (const int32_t id : ids) {
    assert(refs_[id] > 0);
    if (--refs_[id] == 0) free_.push_back(id);
  }
}

std::optional<BlockIdentity> GpuBlockPool::identity(int32_t id) const {
  std::lock_guard lock(mu_);
  return slots_[id].identity;
}

void GpuBlockPool::ref(int32_t id) {
  std::lock_guard lock(mu_);
  if (refs_[id]++ == 0) free_.erase(id);
}

void GpuBlockPool::unref(int32_t id) {
  std::lock_guard lock(mu_);
  assert(refs_[id] > 0);
  if (--refs_[id] == 0) free_.push_back(id);
}

std::optional<int32_t> GpuBlockPool::cache(int32_t id, BlockIdentity identity) {
  return cache(id, std::move(identity), nullptr);
}

std::optional<int32_t> GpuBlockPool::cache(int32_t id, BlockIdentity identity,
                                           const std::function<bool(const BlockHash&)>& refuse) {
  std::lock_guard lock(mu_);
  if (const int32_t held = by_hash_.find(identity.hash); held >= 0) return held;
  if (refuse && refuse(identity.hash)) return -1;
  Slot& s = slots_[id];
  if (s.identity) {
    by_hash_.erase(s.identity->hash);
    if (events_) events_->removed(s.identity->hash);
  }
  by_hash_.insert(identity.hash, id);
  token_len_[id] = static_cast<uint32_t>(identity.token_ids.size());
  if (identity.token_ids.size() == static_cast<size_t>(layout_->block_size)) {
    std::copy(identity.token_ids.begin(), identity.token_ids.end(),
              tokens_.begin() +
                  static_cast<std::ptrdiff_t>(static_cast<size_t>(id) * layout_->block_size));
  }
  s.identity = std::move(identity);
  if (events_) events_->stored(stored_block(*s.identity));
  return std::nullopt;
}

bool GpuBlockPool::uncache(const BlockHash& hash) {
  std::lock_guard lock(mu_);
  const int32_t id = by_hash_.find(hash);
  if (id < 0) return false;
  slots_[id].identity.reset();
  by_hash_.erase(hash);
  if (events_) events_->removed(hash);
  return true;
}

size_t GpuBlockPool::cached_blocks() const {
  std::lock_guard lock(mu_);
  return by_hash_.size();
}

size_t GpuBlockPool::free_blocks() const {
  std::lock_guard lock(mu_);
  return free_.size();
}

size_t GpuBlockPool::blocks_in_use() const {
  std::lock_guard lock(mu_);
  return num_blocks_ - free_.size();
}

}  // namespace kvtier
