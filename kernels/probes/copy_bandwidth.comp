#version 460
// copy_bandwidth: a plain copy, 16 bytes per load and store, grid-stride. The reference every
// GPU figure is compared with (bytes read + written per second), measured in the same run.
#extension GL_GOOGLE_include_directive : require
#include "common/bda.glsl"

layout(local_size_x = 256) in;

layout(push_constant) uniform Params {
  uint64_t src;
  uint64_t dst;
  uint64_t words;  // 16-byte words
} pc;

void main() {
  const uint64_t stride = uint64_t(gl_NumWorkGroups.x) * gl_WorkGroupSize.x;
  for (uint64_t i = gl_GlobalInvocationID.x; i < pc.words; i += stride) {
    U32x4Ref(pc.dst + i * 16).v[0] = U32x4Ref(pc.src + i * 16).v[0];
  }
}
