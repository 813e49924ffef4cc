#version 460
// rms_norm: out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * weight. One workgroup per row; the sum of
// squares is reduced in a fixed order (strided partial sums, then a tree), so a row's result does
// not depend on which other rows are in the launch. Writes f32 rows to out_ and, where out16 is
// not 0, the same values as f16 (common/half_pack.glsl) for the tensor-core matmul that reads them
// next (kernels/coopmat2/matmul_cm2.comp); out_ may be 0 where only the f16 rows are read.
#extension GL_GOOGLE_include_directive : require
#include "common/bda.glsl"
#include "common/dtype.glsl"
#include "common/half_pack.glsl"

layout(local_size_x = 128) in;
layout(push_constant) uniform Params {
  uint64_t x;       // f32 [rows, dim]
  uint64_t weight;  // f32 [dim]
  uint64_t out_;    // f32 [rows, dim], or 0
  uint64_t out16;   // f16 [rows, dim], or 0
  uint dim;         // even
  float eps;
} pc;

shared float s_sum[128];

void main() {
  const uint row = gl_WorkGroupID.x, tid = gl_LocalInvocationID.x;
  const uint64_t base = uint64_t(row) * pc.dim;
  float acc = 0.0;
  for (uint d = tid; d < pc.dim; d += 128) {
    const float v = F32Ref(pc.x + (base + d) * 4).v[0];
    acc += v * v;
  }
  s_sum[tid] = acc;
  barrier();
  for (uint s = 64; s > 0; s /= 2) {
    if (tid < s) s_sum[tid] += s_sum[tid + s];
    barrier();
  }
  const float inv = 1.0 / sqrt(s_sum[0] / float(pc.dim) + pc.eps);
  // Two neighbouring values per invocation, so the f16 pair is one 32-bit store.
  for (uint d = 2 * tid; d < pc.dim; d += 256) {
    const float a = F32Ref(pc.x + (base + d) * 4).v[0] * inv * F32Ref(pc.weight).v[d];
    const float b = F32Ref(pc.x + (base + d + 1) * 4).v[0] * inv * F32Ref(pc.weight).v[d + 1];
    if (pc.out_ != 0) {
      F32Ref(pc.out_ + (base + d) * 4).v[0] = a;
      F32Ref(pc.out_ + (base + d + 1) * 4).v[0] = b;
    }
    if (pc.out16 != 0) U32Ref(pc.out16 + (base + d) * 2).v[0] = pack_half2(a, b);
  }
}
