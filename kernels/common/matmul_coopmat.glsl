// The body of matmul.comp's y[r, n] = (accumulate ? y[r, n] : 0) + sum_k x[r, k] * w[k, n] on
// tensor cores, in two spellings (common/coopmat_types.glsl): model/matmul_coopmat.comp and
// coopmat2/matmul_khr.comp (the same speed on the H100; taken with the attention's). x (f32) is rounded to f16 on its way into shared
// memory, w comes as f16 [k, n], sums are f32. Needs k % 32 == 0, n % 64 == 0 and 16-byte aligned
// rows (the launcher uses matmul.comp otherwise). Every output sums its k in 16-wide steps, in
// order, from its own row of x and column of w, so a row's values are the same bits whatever
// other rows share the launch — as matmul.comp's are, but not the same bits as matmul.comp's.
//
// A workgroup computes 64 rows x 64 columns; each of its four subgroups 32 x 32 (2 x 2 tiles). It
// steps through k BK at a time (specialization constant 0: 32, or 128 for launches of one row
// tile, whose few workgroups wait on memory once per step: four times fewer waits). Within a
// step the 16-wide sub-steps go in order, so every output sums the same products in the same
// order whatever BK is: the two variants give the same bits.
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
#include "common/bda.glsl"
#include "common/coopmat_types.glsl"

layout(buffer_reference, std430, buffer_reference_align = 16) buffer F32x4Ref { vec4 v[]; };

layout(local_size_x = 128) in;
layout(push_constant) uniform Params {
  uint64_t x;  // f32 [rows, k]
  uint64_t w;  // f16 [k, n]
  uint64_t y;  // f32 [rows, n]
  uint rows;
  uint k;
  uint n;
  uint accumulate;
} pc;

layout(constant_id = 0) const uint BK = 32;  // a multiple of 32 dividing k
const uint BM = 64, BN = 64;
// Shared row strides, padded so a tile's 16 rows do not share banks.
const uint XS = BK + 8;
const uint WS = BN + 8;
const uint YS = 16 + 4;
const float F16_MAX = 65504.0;

shared float16_t x_s[BM * XS];
shared float16_t w_s[BK * WS];
shared float y_s[4 * 16 * YS];

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint sg = tid / 32;
  const uint lane = tid % 32;
  const uint row0 = gl_WorkGroupID.y * BM;
  const uint col0 = gl_WorkGroupID.x * BN;
  const uint sr = (sg / 2) * 32;
  const uint sc = (sg % 2) * 32;
  ACC acc[2][2];
  for (uint i = 0; i < 2; ++i)
    for (uint j = 0; j < 2; ++j) acc[i][j] = ACC(0.0);

  for (uint k0 = 0; k0 < pc.k; k0 += BK) {
    barrier();  // every subgroup is done with the previous tiles
    for (uint i = tid; i < BM * BK / 4; i += 128) {  // x: 64 rows x 32, zeros past the last row
      const uint r = i / (BK / 4);
      const uint c = (i % (BK / 4)) * 4;
      const vec4 v = row0 + r < pc.rows ? F32x4Ref(pc.x + (uint64_t(row0 + r) * pc.k + k0 + c) * 4).v[0] : vec4(0.0);
      for (uint t = 0; t < 4; ++t) x_s[r * XS + c + t] = float16_t(clamp(v[t], -F16_MAX, F16_MAX));
    }
    for (uint i = tid; i < BK * BN / 8; i += 128) {  // w: 32 x 64 halves
      const uint r = i / (BN / 8);
      const uint c = (i % (BN / 8)) * 8;
      const uvec4 u = U32x4Ref(pc.w + (uint64_t(k0 + r) * pc.n + col0 + c) * 2).v[0];
      for (uint t = 0; t < 4; ++t) {
        const f16vec2 h2 = unpackFloat2x16(u[t]);
        w_s[r * WS + c + 2 * t] = h2.x;
        w_s[r * WS + c + 2 * t + 1] = h2.y;
      }
    }
    barrier();
    for (uint kk = 0; kk < BK; kk += 16) {
      HALF a[2];
      HALF_B b[2];
      for (uint i = 0; i < 2; ++i) LOAD(a[i], x_s, (sr + i * 16) * XS + kk, XS, false);
      for (uint j = 0; j < 2; ++j) LOAD(b[j], w_s, kk * WS + sc + j * 16, WS, false);
      for (uint i = 0; i < 2; ++i)
        for (uint j = 0; j < 2; ++j) acc[i][j] = MMA(a[i], b[j], acc[i][j]);
    }
  }
  // Each tile through this subgroup's staging area: lane pairs write one row's 16 values each, as
  // two vec4 per lane. With accumulate, both old vec4 are loaded before anything is stored: eight
  // scalar load-add-store steps in a row waited on memory eight times per tile (buffer references
  // may alias, so the compiler kept them in order), and an accumulating matmul of one row tile
  // took ~3x a plain one on the H100. The sums are the same per element: the same bits.
  const uint row = lane / 2;
  const uint half_ = lane % 2;
  for (uint i = 0; i < 2; ++i) {
    for (uint j = 0; j < 2; ++j) {
      subgroupMemoryBarrierShared();
      subgroupBarrier();
      STORE(acc[i][j], y_s, sg * 16 * YS, YS);
      subgroupMemoryBarrierShared();
      subgroupBarrier();
      const uint r = row0 + sr + i * 16 + row;
      if (r >= pc.rows) continue;
      const uint s0 = sg * 16 * YS + row * YS + half_ * 8;
      const vec4 lo = vec4(y_s[s0], y_s[s0 + 1], y_s[s0 + 2], y_s[s0 + 3]);
      const vec4 hi = vec4(y_s[s0 + 4], y_s[s0 + 5], y_s[s0 + 6], y_s[s0 + 7]);
      // Column col0 + sc + j * 16 + half_ * 8: 32-byte aligned, since n % 64 == 0.
      F32x4Ref y = F32x4Ref(pc.y + (uint64_t(r) * pc.n + col0 + sc + j * 16 + half_ * 8) * 4);
      if (pc.accumulate != 0) {
        const vec4 old_lo = y.v[0];
        const vec4 old_hi = y.v[1];
        precise vec4 sum_lo = old_lo + lo;
        precise vec4 sum_hi = old_hi + hi;
        y.v[0] = sum_lo;
        y.v[1] = sum_hi;
      } else {
        y.v[0] = lo;
        y.v[1] = hi;
      }
    }
  }
}
