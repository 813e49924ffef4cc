#version 460
// rope: rotary position embedding in place on q [rows, q_heads, dim] and k [rows, k_heads, dim]
// (Llama's rotate-half pairing: element i with i + dim/2), at positions[row], using cos/sin
// tables [max_pos, dim/2] computed once on the host (the CPU reference uses the same tables).
// An invocation rotates VEC neighbouring pairs with 16-byte loads where VEC is 4 (dim % 8 == 0,
// the launcher's choice): one pair per invocation with 4-byte loads took 40 us a 1B layer at
// 2048 rows on the H200, three times what its bytes need. The arithmetic is per element either way.
#extension GL_GOOGLE_include_directive : require
#include "common/bda.glsl"

layout(local_size_x = 256) in;
layout(constant_id = 0) const uint VEC = 1;  // 1 or 4
layout(push_constant) uniform Params {
  uint64_t q;
  uint64_t k;
  uint64_t positions;  // i32 [rows]
  uint64_t cos_table;  // f32 [max_pos, dim/2]
  uint64_t sin_table;
  uint rows;
  uint q_heads;
  uint k_heads;
  uint dim;
} pc;

vec4 load4(uint64_t at_) {
  if (VEC == 4) return uintBitsToFloat(U32x4Ref(at_).v[0]);
  return vec4(F32Ref(at_).v[0], 0.0, 0.0, 0.0);
}

void store4(uint64_t at_, vec4 x) {
  if (VEC == 4) {
    U32x4Ref(at_).v[0] = floatBitsToUint(x);
  } else {
    F32Ref(at_).v[0] = x.x;
  }
}

void main() {
  const uint half_dim = pc.dim / 2;
  const uint units = half_dim / VEC;  // per head
  const uint per_row = (pc.q_heads + pc.k_heads) * units;
  const uint i = gl_GlobalInvocationID.x;
  if (i >= pc.rows * per_row) return;
  const uint row = i / per_row, rem = i % per_row;
  const uint head = rem / units, j = (rem % units) * VEC;
  const int pos = I32Ref(pc.positions).v[row];
  const vec4 c = load4(pc.cos_table + (uint64_t(pos) * half_dim + j) * 4);
  const vec4 s = load4(pc.sin_table + (uint64_t(pos) * half_dim + j) * 4);
  const bool is_q = head < pc.q_heads;
  const uint64_t base = is_q ? pc.q + (uint64_t(row) * pc.q_heads + head) * pc.dim * 4
                             : pc.k + (uint64_t(row) * pc.k_heads + (head - pc.q_heads)) * pc.dim * 4;
  const vec4 a = load4(base + j * 4), b = load4(base + (j + half_dim) * 4);
  precise vec4 ac = a * c, bs = b * s, bc = b * c, as_ = a * s;
  precise vec4 ra = ac - bs, rb = bc + as_;
  store4(base + j * 4, ra);
  store4(base + (j + half_dim) * 4, rb);
}
