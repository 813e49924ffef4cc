#version 460
// scatter_blocks_from: scatter_blocks, with each block read where it lies instead of from one
// staging buffer: pc.staging is the address of a u64 table, entry i the address of block i's
// bytes (host memory the device imported, or a host-visible upload buffer). An upload from RAM
// then needs no copy into device staging and no copy region per block: one launch reads every
// block across the bus. Exact. Sources need only 8-byte alignment (a block decoded from an SSD
// record is adopted where its tensors lie, 8-byte aligned): each 16 bytes are read as two 8-byte
// halves.
#extension GL_GOOGLE_include_directive : require
#include "common/bda.glsl"
#include "common/block_tensors.glsl"

layout(buffer_reference, std430, buffer_reference_align = 8) buffer U32x2Ref { uvec2 v[]; };

layout(local_size_x = 256) in;

void main() {
  const uint i = gl_WorkGroupID.y;
  const uint off = gl_GlobalInvocationID.x * 16;
  if (i >= pc.num_blocks || off >= pc.block_bytes) return;
  uint tensor;
  const uint64_t dst = paged_address(off, I32Ref(pc.block_ids).v[i], tensor);
  U32x2Ref src = U32x2Ref(U64Ref(pc.staging).v[i] + off);
  U32x4Ref(dst).v[0] = uvec4(src.v[0], src.v[1]);
}
