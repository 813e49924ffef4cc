#version 460
// rope: rotary position embedding in place on q [rows, q_heads, dim] and k [rows, k_heads, dim]
// (Llama's rotate-half pairing: element i with i + dim/2), at positions[row], using cos/sin
// tables [max_pos, dim/2] computed once on the host (the CPU reference uses the same tables).
#extension GL_GOOGLE_include_directive : require
#include "common/bda.glsl"

layout(local_size_x = 256) in;
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

void main() {
  const uint half_dim = pc.dim / 2;
  const uint per_row = (pc.q_heads + pc.k_heads) * half_dim;
  const uint i = gl_GlobalInvocationID.x;
  if (i >= pc.rows * per_row) return;
  const uint row = i / per_row, rem = i % per_row;
  const uint head = rem / half_dim, j = rem % half_dim;
  const int pos = I32Ref(pc.positions).v[row];
  const float c = F32Ref(pc.cos_table + (uint64_t(pos) * half_dim + j) * 4).v[0];
  const float s = F32Ref(pc.sin_table + (uint64_t(pos) * half_dim + j) * 4).v[0];
  const bool is_q = head < pc.q_heads;
  const uint64_t base = is_q ? pc.q + (uint64_t(row) * pc.q_heads + head) * pc.dim * 4
                             : pc.k + (uint64_t(row) * pc.k_heads + (head - pc.q_heads)) * pc.dim * 4;
  F32Ref v = F32Ref(base);
  const float a = v.v[j], b = v.v[j + half_dim];
  precise float ac = a * c, bs = b * s, bc = b * c, as_ = a * s;
  precise float ra = ac - bs, rb = bc + as_;
  v.v[j] = ra;
  v.v[j + half_dim] = rb;
}
