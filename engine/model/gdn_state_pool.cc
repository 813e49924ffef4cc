#include "engine/model/gdn_state_pool.h"

#include <cstring>
#include <string>

#include "engine/vulkan/command_batch.h"

namespace kvtier {

Result<std::unique_ptr<GdnStatePool>> GdnStatePool::create(VulkanContext& ctx, const GdnSpec& spec, int gdn_layers,
                                                           uint32_t slots) {
  if (gdn_layers <= 0 || slots == 0 || spec.state_floats() == 0 || spec.conv_width < 2) {
    return invalid_argument("gdn state pool: needs GDN layers, slots, a state and a conv window");
  }
  std::unique_ptr<GdnStatePool> p(new GdnStatePool(ctx, spec, gdn_layers, slots));
  const uint64_t layers_slots = uint64_t(gdn_layers) * slots;
  KVTIER_ASSIGN_OR_RETURN(p->states_, GpuBuffer::create(ctx, layers_slots * p->state_bytes(), MemoryKind::kDevice));
  KVTIER_ASSIGN_OR_RETURN(p->windows_, GpuBuffer::create(ctx, layers_slots * p->window_bytes(), MemoryKind::kDevice));
  KVTIER_ASSIGN_OR_RETURN(p->down_, GpuBuffer::create(ctx, p->snapshot_bytes(), MemoryKind::kDownload));
  KVTIER_ASSIGN_OR_RETURN(p->up_, GpuBuffer::create(ctx, p->snapshot_bytes(), MemoryKind::kUpload));
  for (uint32_t s = 0; s < slots; ++s) KVTIER_RETURN_IF_ERROR(p->reset(s));
  return p;
}

uint64_t GdnStatePool::state_address(int layer) const { return states_.address() + state_offset(layer, 0); }
uint64_t GdnStatePool::window_address(int layer) const { return windows_.address() + window_offset(layer, 0); }

Status GdnStatePool::check(uint32_t slot, size_t bytes) const {
  if (slot >= slots_) return invalid_argument("gdn state pool: slot " + std::to_string(slot) + " of " + std::to_string(slots_));
  if (bytes != snapshot_bytes()) {
    return invalid_argument("gdn state pool: a snapshot is " + std::to_string(snapshot_bytes()) + " bytes, not " +
                            std::to_string(bytes));
  }
  return ok_status();
}

Status GdnStatePool::reset(uint32_t slot) {
  KVTIER_RETURN_IF_ERROR(check(slot, snapshot_bytes()));
  KVTIER_ASSIGN_OR_RETURN(CommandBatch cb, CommandBatch::begin(ctx_));
  for (int j = 0; j < layers_; ++j) {
    cb.fill(states_, state_offset(j, slot), state_bytes(), 0);
    cb.fill(windows_, window_offset(j, slot), window_bytes(), 0);
  }
  return cb.submit_and_wait();
}

Status GdnStatePool::download(uint32_t slot, std::span<uint8_t> out) {
  KVTIER_RETURN_IF_ERROR(check(slot, out.size()));
  KVTIER_ASSIGN_OR_RETURN(CommandBatch cb, CommandBatch::begin(ctx_));
  uint64_t at = 0;
  for (int j = 0; j < layers_; ++j) {
    cb.copy(states_, state_offset(j, slot), down_, at, state_bytes());
    at += state_bytes();
    cb.copy(windows_, window_offset(j, slot), down_, at, window_bytes());
    at += window_bytes();
  }
  KVTIER_RETURN_IF_ERROR(cb.submit_and_wait());
  KVTIER_RETURN_IF_ERROR(down_.invalidate(0, out.size()));
  std::memcpy(out.data(), down_.mapped(), out.size());
  return ok_status();
}

Status GdnStatePool::upload(uint32_t slot, std::span<const uint8_t> in) {
  KVTIER_RETURN_IF_ERROR(check(slot, in.size()));
  std::memcpy(up_.mapped(), in.data(), in.size());
  KVTIER_RETURN_IF_ERROR(up_.flush(0, in.size()));
  KVTIER_ASSIGN_OR_RETURN(CommandBatch cb, CommandBatch::begin(ctx_));
  uint64_t at = 0;
  for (int j = 0; j < layers_; ++j) {
    cb.copy(up_, at, states_, state_offset(j, slot), state_bytes());
    at += state_bytes();
    cb.copy(up_, at, windows_, window_offset(j, slot), window_bytes());
    at += window_bytes();
  }
  return cb.submit_and_wait();
}

}  // namespace kvtier
