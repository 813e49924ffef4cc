#version 460
// gated_delta_chunked: the gated delta rule in the chunk form (engine/reference/reference_gated_delta.h,
// gated_delta_chunked) over aligned chunks of 16 tokens, for a batch of sequences: one workgroup
// per (head, sequence), one invocation per value column, the column of the state in registers.
// Within a chunk the corrections u solve (I + L) u = beta v - beta b k S_0 by forward
// substitution (L_im = beta_i (b_i / b_m) k_i . k_m), the outputs are b_i q_i S_0 +
// sum_{m <= i} (b_i / b_m)(q_i . k_m) u_m, and the state passed on is b_C S_0 + sum_m (b_C / b_m)
// k_m^T u_m: a chunk's 16 dot products against the state are independent, where the token-by-
// token form chains 16 x 3 d_k dependent steps. Its bits differ from that form's, so a model
// would have to use each for fixed positions (whole aligned chunks of a prefill here, the rest
// token by token) and publish only prefill-computed blocks for restores to stay exact. Not used
// by the tiny hybrid model yet: on the H100 it took 87.9 ms over 8192 tokens where the token-by-
// token kernel takes 60.8. Sums in a fixed order, no fused multiply-adds: a
// sequence's bits never depend on what shares its launch.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "common/bda.glsl"

layout(constant_id = 0) const uint D_K = 128;
#define C 16
layout(local_size_x = 128) in;  // value columns; d_v <= 128
layout(push_constant) uniform Params {
  uint64_t q;            // f32 [tokens, heads, d_k]
  uint64_t k;            // f32 [tokens, heads, d_k]
  uint64_t v;            // f32 [tokens, heads, d_v]
  uint64_t g;            // f32 [tokens, heads], log decays
  uint64_t beta;         // f32 [tokens, heads]
  uint64_t out_;         // f32 [tokens, heads, d_v]
  uint64_t state;        // f32 [slots, heads, d_k, d_v], read and written in place
  uint64_t cu_tokens;    // i32 [sequences + 1]
  uint64_t state_slots;  // i32 [sequences]
  uint64_t ranges;       // i32 [sequences, 3]: rows before the chunks, rows in them, rows after
  uint heads;
  uint d_v;
  float scale;
  uint chunk_begin;      // chunks [chunk_begin, chunk_begin + chunk_count) of each sequence
  uint chunk_count;
} pc;

float load(uint64_t base, uint64_t i) { return F32Ref(base).v[uint(i)]; }
void store(uint64_t base, uint64_t i, float x) { F32Ref(base).v[uint(i)] = x; }

shared float tile_k[C * D_K];
shared float tile_q[C * D_K];
shared float cum[C];      // G_i: cumulative log decay inside the chunk
shared float beta_[C];
shared float lc[C * C];   // L_im = beta_i (b_i / b_m) k_i . k_m, m < i
shared float ac[C * C];   // (b_i / b_m) q_i . k_m, m <= i
shared float eb[C];       // b_i = exp(G_i)
shared float dc[C];       // b_C / b_m
shared float u[C * 128];  // each column's corrections, [token, column]

void main() {
  const uint h = gl_WorkGroupID.x;
  const uint seq = gl_WorkGroupID.y;
  const uint j = gl_LocalInvocationID.x;
  const uint K = D_K, V = pc.d_v, H = pc.heads;
  const uint seq_first = uint(I32Ref(pc.cu_tokens).v[seq]);
  const uint chunk_rows = uint(I32Ref(pc.ranges).v[seq * 3 + 1]);
  const uint chunks = chunk_rows / C;
  const uint c_first = min(pc.chunk_begin, chunks);
  const uint c_last = min(c_first + pc.chunk_count, chunks);
  if (c_first == c_last) return;  // the whole workgroup: it shares barriers
  const uint base = seq_first + uint(I32Ref(pc.ranges).v[seq * 3]);
  const bool column = j < V;
  const uint slot = uint(I32Ref(pc.state_slots).v[seq]);
  const uint64_t state_at = (uint64_t(slot) * H + h) * K * V;

  precise float s[D_K];
  if (column) {
    [[unroll]] for (uint r = 0; r < K; ++r) s[r] = load(pc.state, state_at + uint64_t(r) * V + j);
  }
  for (uint c = c_first; c < c_last; ++c) {
    const uint t0 = base + c * C;
    barrier();  // every column is done with the previous chunk
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
    // The chunk's coefficients: Gram matrices with their decays, a few entries per invocation.
    [[dont_unroll]] for (uint e = j; e < C * C; e += gl_WorkGroupSize.x) {
      const uint i = e / C, m = e % C;
      precise float a = 0.0, b = 0.0;
      if (m <= i) {
        [[unroll]] for (uint r = 0; r < K; ++r) {
          a = a + tile_k[i * K + r] * tile_k[m * K + r];
          b = b + tile_q[i * K + r] * tile_k[m * K + r];
        }
      }
      const float decay = m <= i ? exp(cum[i] - cum[m]) : 0.0;
      precise float l = beta_[i] * decay;
      lc[e] = m < i ? l * a : 0.0;
      precise float x = decay * b;
      ac[e] = x;
    }
    if (j < C) {
      eb[j] = exp(cum[j]);
      dc[j] = exp(cum[C - 1] - cum[j]);
    }
    barrier();
    if (!column) continue;
    // The loops over the chunk's tokens are not unrolled (lavapipe compiled the fully unrolled
    // kernel for over a minute), so each column's corrections live in shared memory, not in an
    // array indexed at run time.
    // Four tokens' dot products against the state column at a time: four independent chains of
    // d_k additions (each in order), where one chain at a time left the GPU waiting on each add.
    [[dont_unroll]] for (uint i0 = 0; i0 < C; i0 += 4) {
      precise float ks[4] = {0.0, 0.0, 0.0, 0.0};
      [[unroll]] for (uint r = 0; r < K; ++r) {
        [[unroll]] for (uint d = 0; d < 4; ++d) ks[d] = ks[d] + tile_k[(i0 + d) * K + r] * s[r];
      }
      [[unroll]] for (uint d = 0; d < 4; ++d) {
        const uint i = i0 + d;
        const float vj = load(pc.v, (uint64_t(t0 + i) * H + h) * V + j);
        precise float w = beta_[i] * vj - beta_[i] * eb[i] * ks[d];
        for (uint m = 0; m < i; ++m) w = w - lc[i * C + m] * u[m * 128 + j];
        u[i * 128 + j] = w;
      }
    }
    [[dont_unroll]] for (uint i0 = 0; i0 < C; i0 += 4) {
      precise float qs[4] = {0.0, 0.0, 0.0, 0.0};
      [[unroll]] for (uint r = 0; r < K; ++r) {
        [[unroll]] for (uint d = 0; d < 4; ++d) qs[d] = qs[d] + tile_q[(i0 + d) * K + r] * s[r];
      }
      [[unroll]] for (uint d = 0; d < 4; ++d) {
        const uint i = i0 + d;
        precise float o = eb[i] * qs[d];
        for (uint m = 0; m <= i; ++m) o = o + ac[i * C + m] * u[m * 128 + j];
        store(pc.out_, (uint64_t(t0 + i) * H + h) * V + j, pc.scale * o);
      }
    }
    // The state passed on: b_C S_0 + sum_m (b_C / b_m) k_m^T u_m, each element's terms in order
    // of m (the loop over m outside, so only one row's update is unrolled).
    const float b_last = eb[C - 1];
    [[unroll]] for (uint r = 0; r < K; ++r) s[r] = b_last * s[r];
    [[dont_unroll]] for (uint m = 0; m < C; ++m) {
      const float um = u[m * 128 + j];
      const float d = dc[m];
      [[unroll]] for (uint r = 0; r < K; ++r) {
        precise float term = d * tile_k[m * K + r] * um;
        s[r] = s[r] + term;
      }
    }
  }
  if (column) {
    [[unroll]] for (uint r = 0; r < K; ++r) store(pc.state, state_at + uint64_t(r) * V + j, s[r]);
  }
}
