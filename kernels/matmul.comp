#version 460
// matmul: y[r, n] = (accumulate ? y[r, n] : 0) + sum_k x[r, k] * w[k, n], f32, row-major.
// Every output sums k = 0, 1, ... in order with separately rounded multiply and add, so a row's
// values are the same bits whatever other rows share the launch (prefix restore relies on it).
// One invocation per column and ROWS rows; no shared memory and no barriers, which keeps it quick
// on lavapipe too. Written for determinism, not speed: the model it serves exercises the cache.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "common/bda.glsl"

#define ROWS 4

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
  const uint col = gl_GlobalInvocationID.x;
  const uint row0 = gl_WorkGroupID.y * ROWS;
  if (col >= pc.n) return;
  const uint nrows = min(uint(ROWS), pc.rows - row0);
  precise float acc[ROWS];
  [[unroll]] for (uint r = 0; r < ROWS; ++r) acc[r] = 0.0;
  for (uint i = 0; i < pc.k; ++i) {
    const float wv = F32Ref(pc.w + (uint64_t(i) * pc.n + col) * 4).v[0];
    [[unroll]] for (uint r = 0; r < ROWS; ++r) {
      const float xv = r < nrows ? F32Ref(pc.x + (uint64_t(row0 + r) * pc.k + i) * 4).v[0] : 0.0;
      precise float prod = xv * wv;
      acc[r] = acc[r] + prod;
    }
  }
  for (uint r = 0; r < nrows; ++r) {
    F32Ref y = F32Ref(pc.y + (uint64_t(row0 + r) * pc.n + col) * 4);
    if (pc.accumulate != 0) {
      precise float sum = y.v[0] + acc[r];
      y.v[0] = sum;
    } else {
      y.v[0] = acc[r];
    }
  }
}
