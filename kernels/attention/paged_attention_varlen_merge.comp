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

// Splits whose partials are loaded together. One split at a time, each split's loads waited on
// the test of the one before (its l): a GPU hit's 16-row suffix over 8176 cached tokens (16
// splits, tiny model, 4 layers, H200) spent 0.043 ms of its 0.355 ms forward in these launches
// and their barriers (measured by leaving them out); 16 at once, 0.357-0.359 -> 0.329-0.338 ms.
const uint BATCH = 16;

// Row `row`, head h, dimensions d and d + 1: their splits merged in order, normalized.
vec2 merged(uint64_t base, uint d) {
  float run_m = -1.0 / 0.0;
  precise float run_l = 0.0;
  precise vec2 run_acc = vec2(0.0);
  for (uint s0 = 0; s0 < pc.max_splits; s0 += BATCH) {
    float ls[BATCH], ms[BATCH];
    vec2 as_[BATCH];
    [[unroll]] for (uint i = 0; i < BATCH; ++i) {
      ls[i] = 0.0;
      ms[i] = 0.0;
      as_[i] = vec2(0.0);
      if (s0 + i < pc.max_splits) {
        const uint64_t at_ = base + uint64_t(s0 + i) * (HEAD_DIM + 2);
        ls[i] = F32Ref(pc.partial + (at_ + HEAD_DIM + 1) * 4).v[0];
        ms[i] = F32Ref(pc.partial + (at_ + HEAD_DIM) * 4).v[0];
        as_[i] = vec2(F32Ref(pc.partial + (at_ + d) * 4).v[0], F32Ref(pc.partial + (at_ + d + 1) * 4).v[0]);
      }
    }
    [[unroll]] for (uint i = 0; i < BATCH; ++i) {
      const float l = ls[i];
      if (!(l > 0.0)) continue;
      if (run_l == 0.0) {
        run_m = ms[i];
        run_l = l;
        run_acc = as_[i];
      } else {
        float mm, fa, fb;
        merge_factors(run_m, ms[i], mm, fa, fb);
        run_l = run_l * fa + l * fb;
        run_acc = run_acc * fa + as_[i] * fb;
        run_m = mm;
      }
    }
  }
  return run_acc / run_l;
}

void main() {
  const uint row = gl_WorkGroupID.x;
  const uint h = gl_WorkGroupID.y;
  const uint64_t base = (uint64_t(row) * pc.num_heads + h) * pc.max_splits * (HEAD_DIM + 2);
  const uint64_t out_row = (uint64_t(row) * pc.num_heads + h) * HEAD_DIM;
  for (uint d = 2 * gl_LocalInvocationID.x; d < HEAD_DIM; d += 2 * gl_WorkGroupSize.x) {
    const vec2 x = merged(base, d);
    if (OUT_HALF != 0) {
      U32Ref(pc.out_ + (out_row + d) * 2).v[0] = pack_half2(x.x, x.y);
    } else {
      F32Ref(pc.out_ + (out_row + d) * 4).v[0] = x.x;
      F32Ref(pc.out_ + (out_row + d + 1) * 4).v[0] = x.y;
    }
  }
}
