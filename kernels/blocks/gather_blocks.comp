#version 460
// gather_blocks: packs the listed GPU blocks (all layers, K and V) into one contiguous staging
// buffer, block after block, each in its document's tensor order, so a block leaves the GPU in
// one copy. One invocation per 16 bytes; y indexes the block list. Exact.
#extension GL_GOOGLE_include_directive : require
#include "common/bda.glsl"
#include "common/block_tensors.glsl"

layout(local_size_x = 256) in;

void main() {
  const uint i = gl_WorkGroupID.y;
  const uint off = gl_GlobalInvocationID.x * 16;
  if (i >= pc.num_blocks || off >= pc.block_bytes) return;
  uint tensor;
  const uint64_t src = paged_address(off, I32Ref(pc.block_ids).v[i], tensor);
  U32x4Ref(pc.staging + uint64_t(i) * pc.block_bytes + off).v[0] = U32x4Ref(src).v[0];
}
