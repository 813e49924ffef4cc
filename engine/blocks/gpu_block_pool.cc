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
    s.ref = 1;
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
  auto it = by_hash_.find(hash);
  return it == by_hash_.end() ? -1 : it->second;
}

int32_t GpuBlockPool::find_and_ref(const BlockHash& hash) {
  std::lock_guard lock(mu_);
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return -1;
  Slot& s = slots_[it->second];
  if (s.ref++ == 0) free_.erase(it->second);
  return it->second;
}

std::vector<bool> GpuBlockPool::contains_many(std::span<const BlockHash> hashes) const {
  std::vector<bool> out(hashes.size());
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < hashes.size(); ++i) out[i] = by_hash_.count(hashes[i]) > 0;
  return out;
}

std::vector<GpuBlockPool::Found> GpuBlockPool::find_and_ref_many(std::span<const BlockHash> hashes,
                                                                 std::span<const std::span<const uint32_t>> tokens) {
  std::vector<Found> out(hashes.size());
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < hashes.size(); ++i) {
    auto it = by_hash_.find(hashes[i]);
    if (it == by_hash_.end()) continue;
    Slot& s = slots_[it->second];
    if (s.ref++ == 0) free_.erase(it->second);
    out[i].id = it->second;
    const std::span<const uint32_t> want = i < tokens.size() ? tokens[i] : std::span<const uint32_t>();
    out[i].same_tokens = s.identity && (want.empty() || std::equal(s.identity->token_ids.begin(),
                                                                   s.identity->token_ids.end(), want.begin(),
                                                                   want.end()));
  }
  return out;
}

void GpuBlockPool::unref_many(std::span<const int32_t> ids) {
  std::lock_guard lock(mu_);
  for (const int32_t id : ids) {
    Slot& s = slots_[id];
    assert(s.ref > 0);
    if (--s.ref == 0) free_.push_back(id);
  }
}

std::optional<BlockIdentity> GpuBlockPool::identity(int32_t id) const {
  std::lock_guard lock(mu_);
  return slots_[id].identity;
}

void GpuBlockPool::ref(int32_t id) {
  std::lock_guard lock(mu_);
  Slot& s = slots_[id];
  if (s.ref++ == 0) free_.erase(id);
}

void GpuBlockPool::unref(int32_t id) {
  std::lock_guard lock(mu_);
  Slot& s = slots_[id];
  assert(s.ref > 0);
  if (--s.ref == 0) free_.push_back(id);
}

std::optional<int32_t> GpuBlockPool::cache(int32_t id, BlockIdentity identity) {
  return cache(id, std::move(identity), nullptr);
}

std::optional<int32_t> GpuBlockPool::cache(int32_t id, BlockIdentity identity,
                                           const std::function<bool(const BlockHash&)>& refuse) {
  std::lock_guard lock(mu_);
  auto it = by_hash_.find(identity.hash);
  if (it != by_hash_.end()) return it->second;
  if (refuse && refuse(identity.hash)) return -1;
  Slot& s = slots_[id];
  if (s.identity) {
    by_hash_.erase(s.identity->hash);
    if (events_) events_->removed(s.identity->hash);
  }
  by_hash_.emplace(identity.hash, id);
  s.identity = std::move(identity);
  if (events_) events_->stored(stored_block(*s.identity));
  return std::nullopt;
}

bool GpuBlockPool::uncache(const BlockHash& hash) {
  std::lock_guard lock(mu_);
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return false;
  slots_[it->second].identity.reset();
  by_hash_.erase(it);
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
