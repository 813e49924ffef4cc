#version 460
// silu_mul: out = silu(gate) * up, silu(x) = x / (1 + exp(-x)) (SwiGLU's elementwise part).
#extension GL_GOOGLE_include_directive : require
#include "common/bda.glsl"

layout(local_size_x = 256) in;
layout(push_constant) uniform Params {
  uint64_t gate;
  uint64_t up;
  uint64_t out_;
  uint count;
} pc;

void main() {
  const uint i = gl_GlobalInvocationID.x;
  if (i >= pc.count) return;
  const float g = F32Ref(pc.gate).v[i];
  F32Ref(pc.out_).v[i] = g / (1.0 + exp(-g)) * F32Ref(pc.up).v[i];
}
