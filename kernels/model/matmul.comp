#version 460
// matmul: y[r, n] = (accumulate ? y[r, n] : 0) + sum_k x[r, k] * w[k, n], f32, row-major, with k
// and n multiples of 4 and 16-byte aligned rows. Every output sums k = 0, 1, ... in order with
// separately rounded multiply and add, so a row's values are the same bits whatever other rows
// share the launch (prefix restore relies on it). One invocation computes 4 rows x 4 columns from
// vec4 loads, with no shared memory and no barriers, which also keeps lavapipe quick. Written for
// determinism, not peak speed: the model it serves exists to exercise the cache.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "common/bda.glsl"

layout(buffer_reference, std430, buffer_reference_align = 16) buffer F32x4Ref { vec4 v[]; };

layout(local_size_x = 64) in;
layout(push_constant) uniform Params {
  uint64_t x;  // [rows, k]
  uint64_t w;  // [k, n]
  uint64_t y;  // [rows, n]
  uint rows;
  uint k;
  uint n;
  uint accumulate;
} pc;

void main() {
  const uint col = gl_GlobalInvocationID.x * 4;
  const uint row0 = gl_WorkGroupID.y * 4;
  if (col >= pc.n) return;
  const uint nrows = min(4u, pc.rows - row0);
  // Rows past the end re-read the last row (their sums are discarded): no branch in the loop.
  uint64_t xrow[4];
  [[unroll]] for (uint r = 0; r < 4; ++r) xrow[r] = pc.x + uint64_t(row0 + min(r, nrows - 1)) * pc.k * 4;
  precise vec4 acc[4];
  [[unroll]] for (uint r = 0; r < 4; ++r) acc[r] = vec4(0.0);
  for (uint i = 0; i < pc.k; i += 4) {
    vec4 wv[4];
    [[unroll]] for (uint j = 0; j < 4; ++j) wv[j] = F32x4Ref(pc.w + (uint64_t(i + j) * pc.n + col) * 4).v[0];
    [[unroll]] for (uint r = 0; r < 4; ++r) {
      const vec4 xv = F32x4Ref(xrow[r] + uint64_t(i) * 4).v[0];
      [[unroll]] for (uint j = 0; j < 4; ++j) {
        precise vec4 prod = xv[j] * wv[j];
        acc[r] = acc[r] + prod;
      }
    }
  }
  for (uint r = 0; r < nrows; ++r) {
    F32x4Ref y = F32x4Ref(pc.y + (uint64_t(row0 + r) * pc.n + col) * 4);
    if (pc.accumulate != 0) {
      precise vec4 sum = y.v[0] + acc[r];
      y.v[0] = sum;
    } else {
      y.v[0] = acc[r];
    }
  }
}
