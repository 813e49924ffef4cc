#version 460
// to_half: f32 values to f16 (common/half_pack.glsl: clamped, then rounded) for the tensor-core
// matmul (kernels/coopmat2/matmul_cm2.comp), where the producer of its input writes only f32
// (attention's output, the gated deltanet's). Four values per invocation.
#extension GL_GOOGLE_include_directive : require
#include "common/bda.glsl"
#include "common/dtype.glsl"
#include "common/half_pack.glsl"

layout(local_size_x = 256) in;
layout(push_constant) uniform Params {
  uint64_t x;    // f32, 16-byte aligned
  uint64_t out_; // f16, 8-byte aligned
  uint quads;    // values / 4
} pc;

layout(buffer_reference, std430, buffer_reference_align = 8) buffer U32x2Ref { uvec2 v[]; };

void main() {
  const uint q = gl_GlobalInvocationID.x;
  if (q >= pc.quads) return;
  U32x2Ref(pc.out_).v[q] = half4_from_f32(U32x4Ref(pc.x).v[q]);
}
