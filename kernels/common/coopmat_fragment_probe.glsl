// coopmat_fragment_probe: one subgroup loads matrices of row and column indices as 16x16 f32
// cooperative matrices and writes 1 if every element sits where common/mma_fragment.glsl says,
// else 0. Run once per device (VulkanContext), in each spelling of the matrix types
// (common/coopmat_types.glsl) the attention kernel may take, before that kernel assumes it.
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_vote : require
#include "common/bda.glsl"
#include "common/mma_fragment.glsl"
#include "common/coopmat_types.glsl"

layout(local_size_x = 32) in;
layout(push_constant) uniform Params { uint64_t out_; } pc;  // u32 flag

shared float idx_s[2][256];

void main() {
  const uint lane = gl_LocalInvocationID.x;
  for (uint k = 0; k < 8; ++k) {
    const uint i = lane * 8 + k;
    idx_s[0][i] = float(i / 16);
    idx_s[1][i] = float(i % 16);
  }
  subgroupMemoryBarrierShared();
  subgroupBarrier();
  ACC rows, cols;
  LOAD(rows, idx_s[0], 0, 16, false);
  LOAD(cols, idx_s[1], 0, 16, false);
  bool ok = rows.length() == 8;
  for (uint e = 0; e < 8 && ok; ++e) {
    ok = uint(rows[e]) == frag_row(lane, e) && uint(cols[e]) == frag_col(lane, e);
  }
  ok = subgroupAll(ok);
  if (lane == 0) U32Ref(pc.out_).v[0] = ok ? 1u : 0u;
}
