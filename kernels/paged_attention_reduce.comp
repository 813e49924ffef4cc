#version 460
// paged_attention_reduce: combines paged_attention_decode's per-split partial results:
// out = sum_i exp(m_i - M) * o_i / sum_i exp(m_i - M) * l_i, M = max_i m_i. Grid (sequence, head);
// splits beyond a sequence's length, or wholly masked, carry m = -inf and weigh nothing.
#extension GL_GOOGLE_include_directive : require
#include "common/bda.glsl"

layout(constant_id = 0) const uint HEAD_DIM = 128;
layout(constant_id = 1) const uint SPLIT = 512;
layout(local_size_x = 128) in;

layout(push_constant) uniform Params {
  uint64_t out_;      // f32 [num_seqs, num_heads, HEAD_DIM]
  uint64_t part_out;  // f32 [num_seqs, num_heads, max_splits, HEAD_DIM]
  uint64_t part_ml;   // f32 [num_seqs, num_heads, max_splits, 2]
  uint64_t seq_lens;  // i32 [num_seqs]
  uint num_heads;
  uint max_splits;
} pc;

void main() {
  const uint seq = gl_WorkGroupID.x;
  const uint h = gl_WorkGroupID.y;
  const uint len = uint(I32Ref(pc.seq_lens).v[seq]);
  const uint splits = min((len + SPLIT - 1) / SPLIT, pc.max_splits);
  const uint64_t row = uint64_t(seq * pc.num_heads + h) * pc.max_splits;
  F32Ref ml = F32Ref(pc.part_ml + row * 8);
  float big_m = -1.0 / 0.0;
  for (uint i = 0; i < splits; ++i) big_m = max(big_m, ml.v[2 * i]);
  float big_l = 0.0;
  for (uint i = 0; i < splits; ++i) {
    const float m = ml.v[2 * i];
    if (m != -1.0 / 0.0) big_l += exp(m - big_m) * ml.v[2 * i + 1];
  }
  for (uint d = gl_LocalInvocationID.x; d < HEAD_DIM; d += gl_WorkGroupSize.x) {
    float o = 0.0;
    for (uint i = 0; i < splits; ++i) {
      const float m = ml.v[2 * i];
      if (m != -1.0 / 0.0) o += exp(m - big_m) * F32Ref(pc.part_out + ((row + i) * HEAD_DIM + d) * 4).v[0];
    }
    F32Ref(pc.out_ + (uint64_t(seq * pc.num_heads + h) * HEAD_DIM + d) * 4).v[0] = o / big_l;
  }
}
