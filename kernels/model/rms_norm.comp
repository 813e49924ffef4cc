#version 460
// rms_norm: out[i] = x[r] / sqrt(mean(x[r]^2) + eps) * weight, where r = rows[i] (rows given: the
// logits' rows, gathered into the first rows of out) or r = i. TPR invocations per row, WG / TPR
// rows per workgroup, each invocation holding up to V of its row's 4-value groups in registers
// between the sum and the output (no second read); the launcher sizes TPR by the row
// (engine/model/rms_norm.cc, with what each shape measured). Writes f32 rows to out_ and, where
// out16 is not 0, the same values as f16 (common/half_pack.glsl) for the tensor-core matmul that
// reads them next (kernels/coopmat2/matmul_cm2.comp); out_ may be 0 where only f16 is read.
//
// The sum of squares has a fixed order, so a row's result does not depend on which other rows
// are in the launch: each invocation sums its values in index order, then an xor butterfly over
// the row's lanes of a subgroup, whose every step adds the same two values in both lanes of a pair
// (a + b == b + a: both then hold the same bits), then, where a row spans several subgroups,
// their sums in subgroup order.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#include "common/bda.glsl"
#include "common/dtype.glsl"
#include "common/half_pack.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;
layout(constant_id = 1) const uint TPR = 128;  // invocations per row: a power of two, <= WG
layout(constant_id = 2) const uint V = 4;      // 4-value groups per invocation: >= dim / 4 / TPR
const uint ROWS = WG / TPR;
layout(buffer_reference, std430, buffer_reference_align = 16) buffer F32x4Ref { vec4 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 8) buffer U32x2Ref { uvec2 v[]; };

layout(push_constant) uniform Params {
  uint64_t x;       // f32 [*, dim]
  uint64_t weight;  // f32 [dim]
  uint64_t out_;    // f32 [num_rows, dim], or 0
  uint64_t out16;   // f16 [num_rows, dim], or 0
  uint64_t rows;    // i32 [num_rows]: the rows of x to take, or 0 (x's first num_rows)
  uint num_rows;
  uint dim;  // even
  float eps;
} pc;

shared float s_part[WG];  // a sum per subgroup

void main() {
  const uint sg = gl_SubgroupSize;
  // Rows follow subgroups: a row's invocations are whole aligned lane groups of one subgroup, or
  // whole subgroups.
  const uint tid = gl_SubgroupID * sg + gl_SubgroupInvocationID;
  const uint r = tid / TPR, t = tid % TPR;
  const uint i = gl_WorkGroupID.x * ROWS + r;
  const bool live = i < pc.num_rows;  // no early return: every lane takes part in the reductions
  const uint src = !live ? 0 : pc.rows != 0 ? uint(I32Ref(pc.rows).v[i]) : i;
  const uint64_t in_ = pc.x + uint64_t(src) * pc.dim * 4;
  const bool quads = pc.dim % 4 == 0;
  const uint groups = pc.dim / 4;
  vec4 v[V];
  float acc = 0.0;
  if (quads) {
    [[unroll]] for (uint j = 0; j < V; ++j) {
      const uint q = t + j * TPR;
      v[j] = live && q < groups ? F32x4Ref(in_).v[q] : vec4(0.0);
      acc += v[j].x * v[j].x;
      acc += v[j].y * v[j].y;
      acc += v[j].z * v[j].z;
      acc += v[j].w * v[j].w;
    }
  } else if (live) {
    for (uint d = t; d < pc.dim; d += TPR) {
      const float a = F32Ref(in_).v[d];
      acc += a * a;
    }
  }
  for (uint o = min(sg, TPR) / 2; o > 0; o /= 2) acc += subgroupShuffleXor(acc, o);
  if (TPR > sg) {
    if (gl_SubgroupInvocationID == 0) s_part[gl_SubgroupID] = acc;
    barrier();
    const uint per = TPR / sg, first = r * per;
    acc = s_part[first];
    for (uint s = 1; s < per; ++s) acc += s_part[first + s];
  }
  if (!live) return;
  const float inv = 1.0 / sqrt(acc / float(pc.dim) + pc.eps);
  const uint64_t out32 = pc.out_ + uint64_t(i) * pc.dim * 4;
  const uint64_t out16 = pc.out16 + uint64_t(i) * pc.dim * 2;
  if (quads) {
    [[unroll]] for (uint j = 0; j < V; ++j) {
      const uint q = t + j * TPR;
      if (q >= groups) break;
      const vec4 y = v[j] * inv * F32x4Ref(pc.weight).v[q];
      if (pc.out_ != 0) F32x4Ref(out32).v[q] = y;
      if (pc.out16 != 0) U32x2Ref(out16).v[q] = uvec2(pack_half2(y.x, y.y), pack_half2(y.z, y.w));
    }
  } else {
    // Two neighbouring values per invocation, so the f16 pair is one 32-bit store.
    for (uint d = 2 * t; d < pc.dim; d += 2 * TPR) {
      const float a = F32Ref(in_).v[d] * inv * F32Ref(pc.weight).v[d];
      const float b = F32Ref(in_).v[d + 1] * inv * F32Ref(pc.weight).v[d + 1];
      if (pc.out_ != 0) {
        F32Ref(out32).v[d] = a;
        F32Ref(out32).v[d + 1] = b;
      }
      if (pc.out16 != 0) U32Ref(out16).v[d / 2] = pack_half2(a, b);
    }
  }
}
