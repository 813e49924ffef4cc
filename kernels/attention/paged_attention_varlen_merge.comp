#version 460
// paged_attention_varlen_merge: after a split launch of paged_attention_varlen, merges each row's
// per-split states in split order with the kernel's own merge step (common/attention_merge.glsl),
// so the result is the bits the kernel would have produced walking the splits itself.
// Grid (row, head); splits a row does not reach carry l == 0 and are skipped.
#extension GL_GOOGLE_include_directive : require
#include "common/bda.glsl"
#include "common/attention_merge.glsl"
#include "common/dtype.glsl"
#include "common/half_pack.glsl"

layout(constant_id = 0) const uint HEAD_DIM = 128;
// 1: out_ holds f16 rows (common/half_pack.glsl's rounding), as the kernel writes them with its
// OUT_HALF (paged_attention_varlen_coopmat).
layout(constant_id = 1) const uint OUT_HALF = 0;
layout(local_size_x = 64) in;

layout(push_constant) uniform Params {
  uint64_t out_;     // f32 (or f16) [total_rows, num_heads, HEAD_DIM]
  uint64_t partial;  // f32 [total_rows, num_heads, max_splits, HEAD_DIM + 2]
  uint num_heads;
  uint max_splits;
} pc;

// Row `row`, head h, dimension d: its splits merged in order, normalized.
float merged(uint64_t base, uint d) {
  float run_m = -1.0 / 0.0;
  precise float run_l = 0.0, run_acc = 0.0;
  for (uint s = 0; s < pc.max_splits; ++s) {
    const uint64_t at_ = base + uint64_t(s) * (HEAD_DIM + 2);
    const float l = F32Ref(pc.partial + (at_ + HEAD_DIM + 1) * 4).v[0];
    if (!(l > 0.0)) continue;
    const float m = F32Ref(pc.partial + (at_ + HEAD_DIM) * 4).v[0];
    const float a = F32Ref(pc.partial + (at_ + d) * 4).v[0];
    if (run_l == 0.0) {
      run_m = m;
      run_l = l;
      run_acc = a;
    } else {
      float mm, fa, fb;
      merge_factors(run_m, m, mm, fa, fb);
      run_l = run_l * fa + l * fb;
      run_acc = run_acc * fa + a * fb;
      run_m = mm;
    }
  }
  return run_acc / run_l;
}

void main() {
  const uint row = gl_WorkGroupID.x;
  const uint h = gl_WorkGroupID.y;
  const uint64_t base = (uint64_t(row) * pc.num_heads + h) * pc.max_splits * (HEAD_DIM + 2);
  const uint64_t out_row = (uint64_t(row) * pc.num_heads + h) * HEAD_DIM;
  if (OUT_HALF != 0) {
    for (uint d = 2 * gl_LocalInvocationID.x; d < HEAD_DIM; d += 2 * gl_WorkGroupSize.x) {
      U32Ref(pc.out_ + (out_row + d) * 2).v[0] = pack_half2(merged(base, d), merged(base, d + 1));
    }
    return;
  }
  for (uint d = gl_LocalInvocationID.x; d < HEAD_DIM; d += gl_WorkGroupSize.x) {
    F32Ref(pc.out_ + (out_row + d) * 4).v[0] = merged(base, d);
  }
}
