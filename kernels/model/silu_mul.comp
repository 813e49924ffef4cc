#version 460
// silu_mul: out = silu(gate) * up, silu(x) = x / (1 + exp(-x)) (SwiGLU's elementwise part). Two
// neighbouring values per invocation: f32 to out_ and, where out16 is not 0, f16 for the
// tensor-core down projection (common/half_pack.glsl; out_ may then be 0).
#extension GL_GOOGLE_include_directive : require
#include "common/bda.glsl"
#include "common/dtype.glsl"
#include "common/half_pack.glsl"

layout(local_size_x = 256) in;
layout(push_constant) uniform Params {
  uint64_t gate;
  uint64_t up;
  uint64_t out_;   // f32, or 0
  uint64_t out16;  // f16, or 0
  uint pairs;      // values / 2
} pc;

float silu_mul(uint i) {
  const float g = F32Ref(pc.gate).v[i];
  return g / (1.0 + exp(-g)) * F32Ref(pc.up).v[i];
}

void main() {
  const uint p = gl_GlobalInvocationID.x;
  if (p >= pc.pairs) return;
  const float a = silu_mul(2 * p), b = silu_mul(2 * p + 1);
  if (pc.out_ != 0) {
    F32Ref(pc.out_).v[2 * p] = a;
    F32Ref(pc.out_).v[2 * p + 1] = b;
  }
  if (pc.out16 != 0) U32Ref(pc.out16).v[p] = pack_half2(a, b);
}
