#version 460
// scatter_blocks: the reverse of gather_blocks: unpacks blocks from a staging buffer into the
// listed GPU blocks of every layer's paged arrays. Exact.
#extension GL_GOOGLE_include_directive : require
#include "common/bda.glsl"
#include "common/block_tensors.glsl"

layout(local_size_x = 256) in;

void main() {
  const uint i = gl_WorkGroupID.y;
  const uint off = gl_GlobalInvocationID.x * 16;
  if (i >= pc.num_blocks || off >= pc.block_bytes) return;
  uint tensor;
  const uint64_t dst = paged_address(off, I32Ref(pc.block_ids).v[i], tensor);
  U32x4Ref(dst).v[0] = U32x4Ref(pc.staging + uint64_t(i) * pc.block_bytes + off).v[0];
}
