#version 460
// gated_delta_chunk_prepare: the first half of the gated delta rule's chunk form, everything a
// chunk of 16 aligned tokens needs that does not depend on the state — so every chunk of a prompt
// runs at once, one workgroup per (chunk, head, sequence), where the state's own pass
// (gated_delta_chunk_scan.comp) must go chunk after chunk.
//
// Within a chunk (cumulative log decay G_i, b_i = exp(G_i)), the token-by-token rule's corrections
// u_i = beta_i v_i - beta_i b_i k_i S_0 - sum_{m<i} L_im u_m with L_im = beta_i (b_i / b_m) k_i.k_m
// are u = U - W S_0, where (I + L) U = diag(beta) V and (I + L) W = diag(beta b) K: both solved
// here by forward substitution, a column per invocation. Written per chunk row and head (P floats,
// P = d_k + d_v + 16 + 2): W's row, U's row, A_im = (b_i / b_m) q_i.k_m for m <= i (0 past i),
// b_i and b_15 / b_i. Sums in a fixed order: a chunk's bits depend on its tokens alone.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "common/bda.glsl"

layout(constant_id = 0) const uint D_K = 128;
#define C 16
layout(local_size_x = 128) in;
layout(push_constant) uniform Params {
  uint64_t q;          // f32 [tokens, heads, d_k]
  uint64_t k;          // f32 [tokens, heads, d_k]
  uint64_t v;          // f32 [tokens, heads, d_v]
  uint64_t g;          // f32 [tokens, heads], log decays
  uint64_t beta;       // f32 [tokens, heads]
  uint64_t scratch;    // f32 [tokens, heads, P], rows of whole chunks written
  uint64_t cu_tokens;  // i32 [sequences + 1]
  uint64_t ranges;     // i32 [sequences, 3]: rows before the chunks, rows in them, rows after
  uint heads;
  uint d_v;
  uint chunk_begin;    // this launch's first chunk (grid x counts from it)
  uint pad;
} pc;

float load(uint64_t base, uint64_t i) { return F32Ref(base).v[uint(i)]; }
void store(uint64_t base, uint64_t i, float x) { F32Ref(base).v[uint(i)] = x; }

shared float tile_k[C * D_K];
shared float tile_q[C * D_K];
shared float cum[C];
shared float beta_[C];
shared float eb[C];
shared float lc[C * C];  // L_im, m < i

void main() {
  const uint c = pc.chunk_begin + gl_WorkGroupID.x;
  const uint h = gl_WorkGroupID.y;
  const uint seq = gl_WorkGroupID.z;
  const uint j = gl_LocalInvocationID.x;
  const uint K = D_K, V = pc.d_v, H = pc.heads, P = D_K + pc.d_v + C + 2;
  if (c >= uint(I32Ref(pc.ranges).v[seq * 3 + 1]) / C) return;  // the whole workgroup
  const uint t0 = uint(I32Ref(pc.cu_tokens).v[seq]) + uint(I32Ref(pc.ranges).v[seq * 3]) + c * C;

  for (uint e = j; e < C * K; e += gl_WorkGroupSize.x) {
    const uint64_t at = (uint64_t(t0 + e / K) * H + h) * K + e % K;
    tile_k[e] = load(pc.k, at);
    tile_q[e] = load(pc.q, at);
  }
  if (j == 0) {
    precise float acc = 0.0;
    for (uint i = 0; i < C; ++i) {
      acc = acc + load(pc.g, uint64_t(t0 + i) * H + h);
      cum[i] = acc;
      beta_[i] = load(pc.beta, uint64_t(t0 + i) * H + h);
    }
  }
  barrier();
  if (j < C) {
    eb[j] = exp(cum[j]);
    const uint64_t row = (uint64_t(t0 + j) * H + h) * P + K + V + C;
    store(pc.scratch, row, exp(cum[j]));
    store(pc.scratch, row + 1, exp(cum[C - 1] - cum[j]));
  }
  // Gram entries with their decays: L for the solve, A for the scan's outputs.
  [[dont_unroll]] for (uint e = j; e < C * C; e += gl_WorkGroupSize.x) {
    const uint i = e / C, m = e % C;
    precise float kk = 0.0, qk = 0.0;
    if (m <= i) {
      [[dont_unroll]] for (uint r = 0; r < K; ++r) {
        kk = fma(tile_k[i * K + r], tile_k[m * K + r], kk);
        qk = fma(tile_q[i * K + r], tile_k[m * K + r], qk);
      }
    }
    const float decay = m <= i ? exp(cum[i] - cum[m]) : 0.0;
    precise float l = beta_[i] * decay * kk;
    lc[e] = m < i ? l : 0.0;
    precise float a = decay * qk;
    store(pc.scratch, (uint64_t(t0 + i) * H + h) * P + K + V + m, a);
  }
  barrier();
  // Forward substitution, one column of [W | U] per invocation, each row's terms in order of m.
  [[dont_unroll]] for (uint col = j; col < K + V; col += gl_WorkGroupSize.x) {
    float x[C];
    [[unroll]] for (uint i = 0; i < C; ++i) {
      const float rhs = col < K ? beta_[i] * eb[i] * tile_k[i * K + col]
                                : beta_[i] * load(pc.v, (uint64_t(t0 + i) * H + h) * V + (col - K));
      precise float s = rhs;
      [[unroll]] for (uint m = 0; m < i; ++m) s = fma(-lc[i * C + m], x[m], s);
      x[i] = s;
      store(pc.scratch, (uint64_t(t0 + i) * H + h) * P + col, s);
    }
  }
}
