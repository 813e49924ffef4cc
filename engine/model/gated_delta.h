// GatedDeltaRule and CausalConv1d: Gated DeltaNet layers' own kernels on the GPU. The rule, for a
// batch of sequences, each continuing from (and leaving) its recurrent state in a state pool — the
// state a hybrid model's prefix cache snapshots beside the attention KV. The token-by-token form
// (gated_delta_recurrent.comp) is exact against the CPU reference but for exp; the chunk form
// (gated_delta_chunk_prepare.comp, then gated_delta_chunk_scan.comp) is exact within rounding and
// the one a prefill's whole aligned chunks take: its chunks' own algebra runs all at once and only
// the state's pass goes chunk after chunk, split over value columns.
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
  // i32 [sequences, 3]: per sequence, rows before its whole aligned chunks, rows in them (a
  // multiple of 16), rows after; 0 when every row goes token by token.
  uint64_t ranges = 0;
  uint32_t max_chunks = 0;  // the most chunks of one sequence
  uint32_t max_before = 0, max_after = 0;  // the most rows of one sequence before / after its chunks
  // The chunk form's working rows, GatedDeltaRule::chunk_scratch_bytes of them for every row of
  // the batch (rows outside chunks are left alone).
  uint64_t chunk_scratch = 0;
};

class GatedDeltaRule {
 public:
  static constexpr uint32_t kMaxHeadDim = 128;  // the kernel's registers (d_k) and columns (d_v)
  static constexpr uint32_t kChunk = 16;        // tokens of one chunk of the chunk form

  // Which rows a token-by-token launch takes: all, or those before / after each sequence's chunks.
  enum class Rows : uint32_t { kAll = 0, kBeforeChunks = 1, kAfterChunks = 2 };

  explicit GatedDeltaRule(VulkanContext& ctx) : ctx_(ctx) {}
  // Records the rule token by token (a launch per stretch of tokens, the state passed through
  // memory between them); invalid_argument for head dims past kMaxHeadDim or an empty shape.
  Status record(CommandBatch& batch, const GatedDeltaBatch& b, Rows rows = Rows::kAll);
  // Records the chunk form over each sequence's chunk rows (b.ranges): every chunk's own algebra
  // in one launch, then the state's pass, a launch per stretch of chunks. Its bits differ from the
  // token-by-token form's: a caller must use each for fixed positions, so a token's bits never
  // depend on how work was split between forwards. Exact within rounding against the references.
  // invalid_argument without ranges or scratch, or for a d_k the chunk kernels cannot take.
  Status record_chunks(CommandBatch& batch, const GatedDeltaBatch& b);
  // Bytes of b.chunk_scratch per row: W, U, the chunk's q.k products, two decays, per head.
  static uint64_t chunk_scratch_bytes(uint32_t heads, uint32_t d_k, uint32_t d_v) {
    return uint64_t(heads) * (d_k + d_v + kChunk + 2) * 4;
  }
  // Whether the chunk form takes these head dims (d_k a multiple of 16: each invocation loads an
  // equal share of a chunk's rows).
  static bool chunk_form_takes(uint32_t d_k) { return d_k % 16 == 0 && d_k <= kMaxHeadDim; }
  // Every row of the batch: token by token before each sequence's chunks, the chunks, token by
  // token after them, in order.
  Status record_all_parts(CommandBatch& batch, const GatedDeltaBatch& b);

 private:
  Status check(const GatedDeltaBatch& b) const;
  VulkanContext& ctx_;
  std::shared_ptr<ComputePipeline> pipeline_, chunk_prepare_, chunk_scan_;
  uint32_t pipeline_dk_ = 0, chunked_dk_ = 0;
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
  // Outputs, then (after a barrier) the windows: two launches. invalid_argument for a width of 0
  // or past kMaxWidth, or no channels.
  Status record(CommandBatch& batch, const CausalConvBatch& b);

 private:
  VulkanContext& ctx_;
  std::shared_ptr<ComputePipeline> pipeline_;
  uint32_t pipeline_width_ = 0;
};

}  // namespace kvtier
