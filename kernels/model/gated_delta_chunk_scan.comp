#version 460
// gated_delta_chunk_scan: the second half of the gated delta rule's chunk form — the state's pass
// from chunk to chunk — for a batch of sequences; gated_delta_chunk_prepare.comp wrote each chunk's
// W, U, A, b and b_15 / b beforehand. One workgroup per (16 value columns, head, sequence) holds
// those columns of the state S [d_k, 16] in shared memory and walks its chunks in order:
//   u = U - W S                                   the chunk's corrections, [16 tokens, 16 columns]
//   o_i = scale (b_i q_i S + sum_{m <= i} A_im u_m)
//   S <- b_15 S + sum_m (b_15 / b_m) k_m^T u_m
// 256 invocations, one (token, column) pair each for u and o, d_k / 16 state rows each for the
// update. A chunk's sums against the state are 16 x 16 independent dot products, where the
// token-by-token form chains 16 x 3 d_k dependent steps for each column; and columns are split
// over workgroups, which the token-by-token form (a whole column's updates need the whole k row)
// cannot do. The next chunk's operands are loaded while this one computes. Every sum in a fixed
// order: a sequence's bits depend only on its chunks, never on what shares the launch or how its
// chunks were split over launches (the state goes through memory between them exactly).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "common/bda.glsl"

layout(constant_id = 0) const uint D_K = 128;  // a multiple of 16
#define C 16
#define CB 16  // value columns per workgroup
layout(local_size_x = 256) in;
layout(push_constant) uniform Params {
  uint64_t q;            // f32 [tokens, heads, d_k]
  uint64_t k;            // f32 [tokens, heads, d_k]
  uint64_t scratch;      // f32 [tokens, heads, P]: gated_delta_chunk_prepare's rows
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
  uint pad;
} pc;

float load(uint64_t base, uint64_t i) { return F32Ref(base).v[uint(i)]; }
void store(uint64_t base, uint64_t i, float x) { F32Ref(base).v[uint(i)] = x; }

shared float S[D_K * CB];  // [state row, column]
shared float tqk[C * D_K];  // the chunk's q rows, then (for the update) its k rows
shared float tw[C * D_K];   // its W rows
shared float tu[C * CB];    // U's columns, then the corrections u
shared float ta[C * C];
shared float teb[C], tdc[C];

// Each invocation's share of a chunk's operands, loaded into registers a chunk ahead: q and W
// while the current chunk computes its corrections, k while it computes outputs and the update.
// 16 x d_k floats of each, so d_k / 16 per invocation. Lavapipe's 32 KiB of shared memory holds
// q and k in turn in one tile at d_k 128.
#define LOADS (D_K / 16)
float pre_q[LOADS], pre_w[LOADS], pre_k[LOADS];
float pre_u, pre_a, pre_b;

uint64_t row_of(uint t0, uint i, uint h) { return uint64_t(t0 + i) * pc.heads + h; }

void fetch_qw(uint t0, uint h, uint jb, uint t) {
  const uint K = D_K, P = D_K + pc.d_v + C + 2;
  [[unroll]] for (uint n = 0; n < LOADS; ++n) {
    const uint e = t + n * 256;
    pre_q[n] = load(pc.q, row_of(t0, e / K, h) * K + e % K);
    pre_w[n] = load(pc.scratch, row_of(t0, e / K, h) * P + e % K);
  }
  const uint col = jb + t % CB;
  pre_u = col < pc.d_v ? load(pc.scratch, row_of(t0, t / CB, h) * P + K + col) : 0.0;
  pre_a = load(pc.scratch, row_of(t0, t / C, h) * P + K + pc.d_v + t % C);
  pre_b = t < 2 * C ? load(pc.scratch, row_of(t0, t % C, h) * P + K + pc.d_v + C + t / C) : 0.0;
}

void fetch_k(uint t0, uint h, uint t) {
  const uint K = D_K;
  [[unroll]] for (uint n = 0; n < LOADS; ++n) {
    const uint e = t + n * 256;
    pre_k[n] = load(pc.k, row_of(t0, e / K, h) * K + e % K);
  }
}

void main() {
  const uint jb = gl_WorkGroupID.x * CB;
  const uint h = gl_WorkGroupID.y;
  const uint seq = gl_WorkGroupID.z;
  const uint t = gl_LocalInvocationID.x;
  const uint K = D_K, V = pc.d_v, H = pc.heads;
  const uint chunks = uint(I32Ref(pc.ranges).v[seq * 3 + 1]) / C;
  const uint c_first = min(pc.chunk_begin, chunks);
  const uint c_last = min(c_first + pc.chunk_count, chunks);
  if (c_first == c_last) return;  // the whole workgroup: it shares barriers
  const uint base = uint(I32Ref(pc.cu_tokens).v[seq]) + uint(I32Ref(pc.ranges).v[seq * 3]);
  const uint slot = uint(I32Ref(pc.state_slots).v[seq]);
  const uint64_t state_at = (uint64_t(slot) * H + h) * K * V;
  const uint i = t / CB, jj = t % CB, col = jb + jj;
  const bool column = col < V;

  for (uint e = t; e < K * CB; e += 256) {
    const uint r = e / CB, cc = jb + e % CB;
    S[e] = cc < V ? load(pc.state, state_at + uint64_t(r) * V + cc) : 0.0;
  }
  fetch_qw(base + c_first * C, h, jb, t);
  fetch_k(base + c_first * C, h, t);
  for (uint c = c_first; c < c_last; ++c) {
    const bool more = c + 1 < c_last;
    barrier();  // the previous chunk's reads of the tiles and its state update are done
    [[unroll]] for (uint n = 0; n < LOADS; ++n) {
      tqk[t + n * 256] = pre_q[n];
      tw[t + n * 256] = pre_w[n];
    }
    tu[t] = pre_u;
    ta[t] = pre_a;
    if (t < C) teb[t] = pre_b;
    else if (t < 2 * C) tdc[t - C] = pre_b;
    barrier();
    if (more) fetch_qw(base + (c + 1) * C, h, jb, t);
    // W_i . S[:, jj] and q_i . S[:, jj]: four partial sums each, added in a fixed order.
    precise float w4[4] = {0.0, 0.0, 0.0, 0.0}, q4[4] = {0.0, 0.0, 0.0, 0.0};
    [[unroll]] for (uint r = 0; r < K; r += 4) {
      [[unroll]] for (uint d = 0; d < 4; ++d) {
        const float s = S[(r + d) * CB + jj];
        w4[d] = fma(tw[i * K + r + d], s, w4[d]);
        q4[d] = fma(tqk[i * K + r + d], s, q4[d]);
      }
    }
    precise float ws = (w4[0] + w4[1]) + (w4[2] + w4[3]);
    precise float qs = (q4[0] + q4[1]) + (q4[2] + q4[3]);
    precise float u = tu[t] - ws;
    barrier();  // every invocation has read S, q and its U entry
    tu[t] = u;
    [[unroll]] for (uint n = 0; n < LOADS; ++n) tqk[t + n * 256] = pre_k[n];
    barrier();
    if (more) fetch_k(base + (c + 1) * C, h, t);
    precise float o = teb[i] * qs;
    for (uint m = 0; m <= i; ++m) o = fma(ta[i * C + m], tu[m * CB + jj], o);
    if (column) store(pc.out_, (uint64_t(base + c * C + i) * H + h) * V + col, pc.scale * o);
    // This invocation's state rows i, i + 16, ...: b_15 S + sum_m (b_15 / b_m) k_m^T u_m, in order of m.
    const float b_last = teb[C - 1];
    [[unroll]] for (uint n = 0; n < K / C; ++n) {
      const uint r = i + n * C;
      precise float s = b_last * S[r * CB + jj];
      [[unroll]] for (uint m = 0; m < C; ++m) s = fma(tdc[m] * tqk[m * K + r], tu[m * CB + jj], s);
      S[r * CB + jj] = s;
    }
  }
  barrier();
  for (uint e = t; e < K * CB; e += 256) {
    const uint r = e / CB, cc = jb + e % CB;
    if (cc < V) store(pc.state, state_at + uint64_t(r) * V + cc, S[e]);
  }
}
