#version 460
// kv_half_staging: a batch's context blocks of one layer's K and V (bf16, f32 or f16) copied as
// f16 into a staging cache, before the tensor-core prefill reads them (engine/attention/
// kv_half_staging.h says when). The attention kernel then takes its f16 path, whose chunk loads
// are plain copies, and computes block addresses instead of reading the block table before each
// load. A long prompt reads each chunk once per tile of rows below it: on the H100 (bf16, 16k
// tokens) converting every chunk in the kernel ran at 156-157 TFLOP/s, with this copy first at
// 172-174. An f16 cache is copied only by request (no launcher stages one: no gain measured).
// The conversion is the kernel's own (common/half_pack.glsl): same bits either way.
//
// Workgroup (j, s) converts block j of sequence s to staging block s * max_blocks_per_seq + j and
// writes that number into the staging block table. Blocks past the sequence's length are left as
// they are (no kernel reads them) but their table entries are written, so the table is whole.
#extension GL_GOOGLE_include_directive : require
#include "common/bda.glsl"
#include "common/dtype.glsl"
#include "common/half_pack.glsl"

layout(local_size_x = 256) in;
layout(constant_id = 0) const uint DTYPE = DT_BF16;  // the cache's

layout(push_constant) uniform Params {
  uint64_t k_cache;
  uint64_t v_cache;
  uint64_t block_tables;
  uint64_t seq_lens;
  uint64_t k_out;
  uint64_t v_out;
  uint64_t table_out;
  uint block_elems;  // block_size * num_kv_heads * head_dim, a multiple of 8
  uint block_size;
  uint max_blocks_per_seq;
} pc;

void main() {
  const uint j = gl_WorkGroupID.x;
  const uint s = gl_WorkGroupID.y;
  const uint slot = s * pc.max_blocks_per_seq + j;
  if (gl_LocalInvocationID.x == 0) I32Ref(pc.table_out).v[slot] = int(slot);
  if (int(j * pc.block_size) >= I32Ref(pc.seq_lens).v[s]) return;
  const int blk = I32Ref(pc.block_tables).v[slot];
  const uint64_t src = uint64_t(blk) * pc.block_elems;  // elements
  const uint64_t dst = uint64_t(slot) * pc.block_elems;
  for (uint e = gl_LocalInvocationID.x * 8; e < pc.block_elems; e += 256 * 8) {
    if (DTYPE == DT_F16) {
      const uint64_t at_ = (src + e) * 2, to = (dst + e) * 2;
      U32x4Ref(pc.k_out + to).v[0] = U32x4Ref(pc.k_cache + at_).v[0];
      U32x4Ref(pc.v_out + to).v[0] = U32x4Ref(pc.v_cache + at_).v[0];
    } else if (DTYPE == DT_BF16) {
      const uint64_t from = (src + e) * 2, to = (dst + e) * 2;
      U32x4Ref(pc.k_out + to).v[0] = half8_from_bf16(U32x4Ref(pc.k_cache + from).v[0]);
      U32x4Ref(pc.v_out + to).v[0] = half8_from_bf16(U32x4Ref(pc.v_cache + from).v[0]);
    } else {
      const uint64_t from = (src + e) * 4, to = (dst + e) * 2;
      const uvec2 k0 = half4_from_f32(U32x4Ref(pc.k_cache + from).v[0]);
      const uvec2 k1 = half4_from_f32(U32x4Ref(pc.k_cache + from + 16).v[0]);
      const uvec2 v0 = half4_from_f32(U32x4Ref(pc.v_cache + from).v[0]);
      const uvec2 v1 = half4_from_f32(U32x4Ref(pc.v_cache + from + 16).v[0]);
      U32x4Ref(pc.k_out + to).v[0] = uvec4(k0, k1);
      U32x4Ref(pc.v_out + to).v[0] = uvec4(v0, v1);
    }
  }
}
