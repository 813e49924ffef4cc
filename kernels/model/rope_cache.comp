#version 460
// rope_cache: rope.comp and attention/reshape_and_cache.comp in one launch — q rotated in place,
// k rotated and written with v into the paged cache at slot_mapping[row] (-1 skips), nothing else.
// A short forward (a hit's 16-token suffix) is launch-bound: each launch and its barrier cost a
// few microseconds whatever they do, and these two ran back to back on every attention layer.
// The arithmetic is theirs, element for element: the same rotation (precise, from the same
// tables) and the same rounding into the cache's dtype (common/dtype.glsl), so the same bits.
// Nobody reads the rotated k rows after the cache write: they are not written back.
//
// An invocation takes 4 neighbouring pairs (i, i + dim/2) of one head of one row: units over
// q heads, then k heads, then v heads (whose values are only copied). dim % 8 == 0 (the launcher
// keeps rope and reshape_and_cache for other shapes).
#extension GL_GOOGLE_include_directive : require
#include "common/bda.glsl"
#include "common/dtype.glsl"

layout(local_size_x = 256) in;
layout(push_constant) uniform Params {
  uint64_t q;          // f32 [rows, q_heads, dim]
  uint64_t k;          // f32 [rows, k_heads, dim]
  uint64_t v;          // f32 [rows, k_heads, dim]
  uint64_t positions;  // i32 [rows]
  uint64_t cos_table;  // f32 [max_pos, dim/2]
  uint64_t sin_table;
  uint64_t k_cache;    // [num_blocks * block_size, k_heads, dim] in cache_dtype
  uint64_t v_cache;
  uint64_t slot_mapping;  // i32 [rows]
  uint rows;
  uint q_heads;
  uint k_heads;
  uint dim;
  uint cache_dtype;
} pc;

layout(buffer_reference, std430, buffer_reference_align = 8) buffer U32x2Ref { uvec2 v[]; };

vec4 load4(uint64_t at_) { return uintBitsToFloat(U32x4Ref(at_).v[0]); }

// Four f32 values at element e of a cache row array, in its dtype (as reshape_and_cache stores).
void store_cache4(uint64_t base, uint64_t e, vec4 x) {
  if (pc.cache_dtype == DT_F32) {
    U32x4Ref(base + e * 4).v[0] = floatBitsToUint(x);
  } else {
    const uint dt = pc.cache_dtype;
    U32x2Ref(base + e * 2).v[0] = uvec2(to_dtype_bits(x.x, dt) | (to_dtype_bits(x.y, dt) << 16),
                                        to_dtype_bits(x.z, dt) | (to_dtype_bits(x.w, dt) << 16));
  }
}

void main() {
  const uint half_dim = pc.dim / 2;
  const uint units = half_dim / 4;  // per head
  const uint per_row = (pc.q_heads + 2 * pc.k_heads) * units;
  const uint i = gl_GlobalInvocationID.x;
  if (i >= pc.rows * per_row) return;
  const uint row = i / per_row, rem = i % per_row;
  const uint head = rem / units, j = (rem % units) * 4;
  const int slot = I32Ref(pc.slot_mapping).v[row];
  if (head >= pc.q_heads + pc.k_heads) {  // v: copied into the cache
    if (slot < 0) return;
    const uint kvh = head - pc.q_heads - pc.k_heads;
    const uint64_t src = pc.v + (uint64_t(row) * pc.k_heads + kvh) * pc.dim * 4;
    const uint64_t dst = (uint64_t(slot) * pc.k_heads + kvh) * pc.dim;
    store_cache4(pc.v_cache, dst + j, load4(src + j * 4));
    store_cache4(pc.v_cache, dst + j + half_dim, load4(src + (j + half_dim) * 4));
    return;
  }
  const bool is_q = head < pc.q_heads;
  if (!is_q && slot < 0) return;
  const int pos = I32Ref(pc.positions).v[row];
  const vec4 c = load4(pc.cos_table + (uint64_t(pos) * half_dim + j) * 4);
  const vec4 s = load4(pc.sin_table + (uint64_t(pos) * half_dim + j) * 4);
  const uint64_t base = is_q ? pc.q + (uint64_t(row) * pc.q_heads + head) * pc.dim * 4
                             : pc.k + (uint64_t(row) * pc.k_heads + (head - pc.q_heads)) * pc.dim * 4;
  const vec4 a = load4(base + j * 4), b = load4(base + (j + half_dim) * 4);
  precise vec4 ac = a * c, bs = b * s, bc = b * c, as_ = a * s;
  precise vec4 ra = ac - bs, rb = bc + as_;
  if (is_q) {
    U32x4Ref(base + j * 4).v[0] = floatBitsToUint(ra);
    U32x4Ref(base + (j + half_dim) * 4).v[0] = floatBitsToUint(rb);
    return;
  }
  const uint64_t dst = (uint64_t(slot) * pc.k_heads + (head - pc.q_heads)) * pc.dim;
  store_cache4(pc.k_cache, dst + j, ra);
  store_cache4(pc.k_cache, dst + j + half_dim, rb);
}
