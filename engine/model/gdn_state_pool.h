// GdnStatePool: every Gated DeltaNet layer's recurrent state and conv window for a number of
// sequence slots, on the GPU — what a hybrid model continues from and leaves per sequence, and
// what a prefix snapshot copies out (download) and back in (upload), in HybridLayout's snapshot
// order (per GDN layer: the state, then the window; f32, bytes as they are).
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "engine/vulkan/gpu_buffer.h"
#include "engine/vulkan/vulkan_context.h"
#include "serialize/hybrid_layout.h"

namespace kvtier {

// Not thread-safe (its staging buffers); one per model.
class GdnStatePool {
 public:
  static Result<std::unique_ptr<GdnStatePool>> create(VulkanContext& ctx, const GdnSpec& spec, int gdn_layers,
                                                      uint32_t slots);

  const GdnSpec& spec() const { return spec_; }
  int gdn_layers() const { return layers_; }
  uint32_t slots() const { return slots_; }
  // Layer j's arrays, as the kernels take them: states [slots, heads, d_k, d_v], windows
  // [slots, conv_channels, conv_width - 1].
  uint64_t state_address(int layer) const;
  uint64_t window_address(int layer) const;
  size_t snapshot_bytes() const { return layers_ * (state_bytes() + window_bytes()); }

  // A fresh sequence: every state and window of `slot` zero.
  Status reset(uint32_t slot);
  // The snapshot of `slot` into `out` (snapshot_bytes()), and back. Each waits for the GPU.
  Status download(uint32_t slot, std::span<uint8_t> out);
  Status upload(uint32_t slot, std::span<const uint8_t> in);

 private:
  GdnStatePool(VulkanContext& ctx, const GdnSpec& spec, int layers, uint32_t slots)
      : ctx_(ctx), spec_(spec), layers_(layers), slots_(slots) {}
  size_t state_bytes() const { return spec_.state_floats() * sizeof(float); }
  size_t window_bytes() const { return spec_.window_floats() * sizeof(float); }
  // Where slot `slot` of layer `layer` lies in states_ and windows_.
  uint64_t state_offset(int layer, uint32_t slot) const { return (uint64_t(layer) * slots_ + slot) * state_bytes(); }
  uint64_t window_offset(int layer, uint32_t slot) const { return (uint64_t(layer) * slots_ + slot) * window_bytes(); }
  Status check(uint32_t slot, size_t bytes) const;

  VulkanContext& ctx_;
  GdnSpec spec_;
  int layers_;
  uint32_t slots_;
  GpuBuffer states_, windows_, down_, up_;
};

}  // namespace kvtier
