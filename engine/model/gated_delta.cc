#include "engine/model/gated_delta.h"

#include <algorithm>
#include <string>

namespace kvtier {
namespace {

struct GatedDeltaParams {
  uint64_t q, k, v, g, beta, out, state, cu_tokens, state_slots;
  uint32_t heads, d_k, d_v;
  float scale;
  uint32_t token_begin, token_count;
  uint64_t ranges;
  uint32_t part, pad;
};
struct ChunkPrepareParams {
  uint64_t q, k, v, g, beta, scratch, cu_tokens, ranges;
  uint32_t heads, d_v, chunk_begin, pad;
};
struct ChunkScanParams {
  uint64_t q, k, scratch, out, state, cu_tokens, state_slots, ranges;
  uint32_t heads, d_v;
  float scale;
  uint32_t chunk_begin, chunk_count, pad;
};

// Loop iterations one launch may run per invocation on lavapipe, where results went wrong past
// about 65000 (see the kernel); a token costs 3 d_k + 1 of them. Other drivers take a sequence in
// one launch: on the H100 the launches (and barriers) of stretches cost more than the work of the
// tiny hybrid's chunks. The state goes through memory between launches, bit for bit, so how a
// sequence is cut never changes its bits.
uint32_t loop_budget(const VulkanContext& ctx) {
  return ctx.info().name.find("llvmpipe") != std::string::npos ? 32768u : 0x40000000u;
}

}  // namespace

Status GatedDeltaRule::check(const GatedDeltaBatch& b) const {
  if (b.heads == 0 || b.d_k == 0 || b.d_v == 0) return invalid_argument("gated delta rule: empty shape");
  if (b.d_k > kMaxHeadDim || b.d_v > kMaxHeadDim) {
    return invalid_argument("gated delta rule: d_k " + std::to_string(b.d_k) + " and d_v " + std::to_string(b.d_v) +
                            " must be at most " + std::to_string(kMaxHeadDim));
  }
  return ok_status();
}

Status GatedDeltaRule::record_chunks(CommandBatch& batch, const GatedDeltaBatch& b) {
  KVTIER_RETURN_IF_ERROR(check(b));
  if (b.ranges == 0 || b.chunk_scratch == 0) {
    return invalid_argument(
        "gated delta rule: the chunk form needs each sequence's ranges and its scratch");
  }
  if (!chunk_form_takes(b.d_k)) {
    return invalid_argument("gated delta rule: the chunk form takes d_k in multiples of 16, not " +
                            std::to_string(b.d_k));
  }
  if (b.sequences == 0 || b.max_chunks == 0) return ok_status();
  if (!chunk_scan_ || chunked_dk_ != b.d_k) {
    KVTIER_ASSIGN_OR_RETURN(chunk_prepare_, ctx_.pipeline("gated_delta_chunk_prepare", {b.d_k},
                                                          sizeof(ChunkPrepareParams)));
    KVTIER_ASSIGN_OR_RETURN(
        chunk_scan_, ctx_.pipeline("gated_delta_chunk_scan", {b.d_k}, sizeof(ChunkScanParams)));
    chunked_dk_ = b.d_k;
  }
  // Every chunk of every sequence at once (grid x is chunks: as many a launch as the device takes,
  // at least Vulkan's minimum of 65535).
  const uint32_t grid_x = std::max(65535u, ctx_.info().max_workgroup_count[0]);
  for (uint32_t begin = 0; begin < b.max_chunks; begin += grid_x) {
    const ChunkPrepareParams p{b.q,         b.k,      b.v,     b.g,   b.beta, b.chunk_scratch,
                               b.cu_tokens, b.ranges, b.heads, b.d_v, begin,  0};
    batch.dispatch(*chunk_prepare_, p, std::min(grid_x, b.max_chunks - begin), b.heads,
                   b.sequences);
  }
  batch.barrier();
  // The state's pass. A chunk costs an invocation about 2 d_k + 32 loop iterations where lavapipe
  // does not unroll them.
  const uint32_t stretch = std::max<uint32_t>(1, loop_budget(ctx_) / (2 * b.d_k + 2 * kChunk));
  const uint32_t column_groups = (b.d_v + 15) / 16;
  for (uint32_t begin = 0; begin < b.max_chunks; begin += stretch) {
    if (begin > 0) batch.barrier();
    const ChunkScanParams p{b.q,         b.k,           b.chunk_scratch, b.out,   b.state,
                            b.cu_tokens, b.state_slots, b.ranges,        b.heads, b.d_v,
                            b.scale,     begin,         stretch,         0};
    batch.dispatch(*chunk_scan_, p, column_groups, b.heads, b.sequences);
  }
  return ok_status();
}

Status GatedDeltaRule::record_all_parts(CommandBatch& batch, const GatedDeltaBatch& b) {
  KVTIER_RETURN_IF_ERROR(record(batch, b, Rows::kBeforeChunks));
  batch.barrier();
  KVTIER_RETURN_IF_ERROR(record_chunks(batch, b));
  batch.barrier();
  return record(batch, b, Rows::kAfterChunks);
}

Status GatedDeltaRule::record(CommandBatch& batch, const GatedDeltaBatch& b, Rows rows) {
  KVTIER_RETURN_IF_ERROR(check(b));
  if (rows != Rows::kAll && b.ranges == 0) return invalid_argument("gated delta rule: a part needs the ranges");
  if (b.sequences == 0) return ok_status();
  if (!pipeline_ || pipeline_dk_ != b.d_k) {  // one pipeline per d_k (a specialization constant)
    KVTIER_ASSIGN_OR_RETURN(pipeline_, ctx_.pipeline("gated_delta_recurrent", {b.d_k}, sizeof(GatedDeltaParams)));
    pipeline_dk_ = b.d_k;
  }
  const uint32_t stretch = std::max<uint32_t>(1, loop_budget(ctx_) / (3 * b.d_k + 1));
  const uint32_t tokens = rows == Rows::kAll            ? b.max_tokens
                          : rows == Rows::kBeforeChunks ? b.max_before
                                                        : b.max_after;
  for (uint32_t begin = 0; begin < tokens; begin += stretch) {
    if (begin > 0) batch.barrier();  // the state the previous stretch wrote
    const GatedDeltaParams p{b.q, b.k, b.v, b.g, b.beta, b.out, b.state, b.cu_tokens, b.state_slots,
                             b.heads, b.d_k, b.d_v, b.scale, begin, stretch, b.ranges,
                             static_cast<uint32_t>(rows), 0};
    batch.dispatch(*pipeline_, p, b.heads, b.sequences);
  }
  return ok_status();
}

namespace {

struct CausalConvParams {
  uint64_t x, weight, bias, window, y, cu_tokens, window_slots;
  uint32_t channels, part, block_begin, pad;
};

}  // namespace

Status CausalConv1d::record(CommandBatch& batch, const CausalConvBatch& b) {
  if (b.channels == 0 || b.width == 0 || b.width > kMaxWidth) {
    return invalid_argument("causal conv1d: width " + std::to_string(b.width) + " must be 1 to " +
                            std::to_string(kMaxWidth) + ", with at least one channel");
  }
  if (b.sequences == 0 || b.max_tokens == 0) return ok_status();
  if (!pipeline_ ||
      pipeline_width_ != b.width) {  // one pipeline per width (a specialization constant)
    KVTIER_ASSIGN_OR_RETURN(pipeline_,
                            ctx_.pipeline("causal_conv1d", {b.width}, sizeof(CausalConvParams)));
    pipeline_width_ = b.width;
  }
  // Outputs: every 16 rows of every sequence at once (kernel's TOKENS). Then, once all have read
  // the windows, the windows.
  constexpr uint32_t kTokens = 16;
  const uint32_t grid_y = std::max(65535u, ctx_.info().max_workgroup_count[1]);
  const uint32_t groups = (b.channels + 63) / 64, blocks = (b.max_tokens + kTokens - 1) / kTokens;
  for (uint32_t begin = 0; begin < blocks; begin += grid_y) {  // no barrier: disjoint rows
    const CausalConvParams p{
        b.x, b.weight, b.bias, b.window, b.y, b.cu_tokens, b.window_slots, b.channels, 0, begin, 0};
    batch.dispatch(*pipeline_, p, groups, std::min(grid_y, blocks - begin), b.sequences);
  }
  batch.barrier();
  const CausalConvParams windows{
      b.x, b.weight, b.bias, b.window, b.y, b.cu_tokens, b.window_slots, b.channels, 1, 0, 0};
  batch.dispatch(*pipeline_, windows, groups, 1, b.sequences);
  return ok_status();
}

}  // namespace kvtier
