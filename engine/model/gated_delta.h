// GatedDeltaRule and CausalConv1d: Gated DeltaNet layers' own kernels on the GPU. The rule, for a batch of
// sequences, each continuing from (and leaving) its recurrent state in a state pool — the state a
// hybrid model's prefix cache snapshots beside the attention KV (issue 35). This is the token-by-
// token form (gated_delta_recurrent.comp): exact against the CPU reference but for exp, and right
// for decode; long prefills will want the chunked form (reference_gated_delta.h has its algebra).
#pragma once

#include <cstdint>
#include <memory>

#include "engine/vulkan/command_batch.h"
#include "engine/vulkan/compute_pipeline.h"
#include "engine/vulkan/vulkan_context.h"

namespace kvtier {

// Device addresses of f32 buffers, laid out as gated_delta_recurrent.comp says.
struct GatedDeltaBatch {
  uint64_t q = 0, k = 0, v = 0, g = 0, beta = 0, out = 0;
  uint64_t state = 0;        // [slots, heads, d_k, d_v]
  uint64_t cu_tokens = 0;    // i32 [sequences + 1]
  uint64_t state_slots = 0;  // i32 [sequences]
  uint32_t sequences = 0, heads = 0, d_k = 0, d_v = 0;
  uint32_t max_tokens = 0;  // of the longest sequence
  float scale = 1.0f;
};

class GatedDeltaRule {
 public:
  static constexpr uint32_t kMaxHeadDim = 128;  // the kernel's registers (d_k) and columns (d_v)

  explicit GatedDeltaRule(VulkanContext& ctx) : ctx_(ctx) {}
  // Records the batch (a launch per stretch of tokens, the state passed through memory between
  // them); invalid_argument for head dims past kMaxHeadDim or an empty shape.
  Status record(CommandBatch& batch, const GatedDeltaBatch& b);

 private:
  VulkanContext& ctx_;
  std::shared_ptr<ComputePipeline> pipeline_;
  uint32_t pipeline_dk_ = 0;
};

// The causal depthwise conv1d + SiLU before the rule (causal_conv1d.comp), each sequence
// continuing from and leaving its window of the last width - 1 inputs in a window pool.
struct CausalConvBatch {
  uint64_t x = 0, weight = 0, bias = 0, window = 0, y = 0;  // bias 0: none
  uint64_t cu_tokens = 0, window_slots = 0;                // i32
  uint32_t sequences = 0, channels = 0, width = 0;
  uint32_t max_tokens = 0;  // of the longest sequence
};

class CausalConv1d {
 public:
  static constexpr uint32_t kMaxWidth = 8;

  explicit CausalConv1d(VulkanContext& ctx) : ctx_(ctx) {}
  // invalid_argument for a width of 0 or past kMaxWidth, or no channels.
  Status record(CommandBatch& batch, const CausalConvBatch& b);

 private:
  VulkanContext& ctx_;
  std::shared_ptr<ComputePipeline> pipeline_;
};

}  // namespace kvtier
