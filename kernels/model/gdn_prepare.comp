#version 460
// gdn_prepare: what a Gated DeltaNet layer feeds the rule, from its conv output and its gate
// projections, one invocation per (row, head): q and k cut out of the conv's channels and
// L2-normalised, v cut out, the log decay g = -exp(A_log) softplus(a + dt_bias) and the write
// strength beta = sigmoid(b) (Qwen3-Next's forms). Each row on its own, sums in a fixed order:
// a row's outputs do not depend on what shares the launch.
#extension GL_GOOGLE_include_directive : require
#include "common/bda.glsl"

layout(local_size_x = 64) in;
layout(push_constant) uniform Params {
  uint64_t conv;     // f32 [rows, heads * (2 d_k + d_v)]: q heads | k heads | v heads
  uint64_t ab;       // f32 [rows, 2 heads]: a | b
  uint64_t a_log;    // f32 [heads]
  uint64_t dt_bias;  // f32 [heads]
  uint64_t q;        // f32 [rows, heads, d_k]
  uint64_t k;        // f32 [rows, heads, d_k]
  uint64_t v;        // f32 [rows, heads, d_v]
  uint64_t g;        // f32 [rows, heads]
  uint64_t beta;     // f32 [rows, heads]
  uint rows;
  uint heads;
  uint d_k;
  uint d_v;
  float eps;
} pc;

float load(uint64_t base, uint i) { return F32Ref(base).v[i]; }
void store(uint64_t base, uint i, float x) { F32Ref(base).v[i] = x; }

void main() {
  const uint i = gl_GlobalInvocationID.x;
  if (i >= pc.rows * pc.heads) return;
  const uint row = i / pc.heads, h = i % pc.heads;
  const uint H = pc.heads, K = pc.d_k, V = pc.d_v;
  const uint in_row = row * H * (2 * K + V);
  const uint q_in = in_row + h * K, k_in = in_row + H * K + h * K, v_in = in_row + 2 * H * K + h * V;
  precise float qq = 0.0, kk = 0.0;
  for (uint d = 0; d < K; ++d) {
    const float a = load(pc.conv, q_in + d), b = load(pc.conv, k_in + d);
    qq = qq + a * a;
    kk = kk + b * b;
  }
  const float q_scale = 1.0 / sqrt(qq + pc.eps), k_scale = 1.0 / sqrt(kk + pc.eps);
  const uint out_k = (row * H + h) * K, out_v = (row * H + h) * V;
  for (uint d = 0; d < K; ++d) {
    store(pc.q, out_k + d, load(pc.conv, q_in + d) * q_scale);
    store(pc.k, out_k + d, load(pc.conv, k_in + d) * k_scale);
  }
  for (uint d = 0; d < V; ++d) store(pc.v, out_v + d, load(pc.conv, v_in + d));
  const float a = load(pc.ab, row * 2 * H + h) + load(pc.dt_bias, h);
  const float softplus = a > 20.0 ? a : log(1.0 + exp(a));
  store(pc.g, row * H + h, -exp(load(pc.a_log, h)) * softplus);
  store(pc.beta, row * H + h, 1.0 / (1.0 + exp(-load(pc.ab, row * 2 * H + H + h))));
}
