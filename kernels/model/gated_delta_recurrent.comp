#version 460
// gated_delta_recurrent: the gated delta rule token by token (engine/reference/reference_gated_delta.h)
// for a batch of sequences: one workgroup per (head, sequence), one invocation per value column.
// A column of the state lives in its invocation's registers, so no sum crosses invocations and
// every sum runs in the CPU reference's order (`precise`: no fused multiply-adds), and a
// sequence's bits never depend on what shares its launch.
//   S <- a S + beta k^T (v - a k S),   o = scale q S,   a = exp(g)
// One launch takes tokens [token_begin, token_begin + token_count) of every sequence, the state
// going through memory between launches. Measured on lavapipe (Mesa 22.3): one launch over a long
// sequence went wrong, silently, from the ~21000th q element on whatever d_k — about 65000 loop
// iterations of one invocation, which fits llvmpipe's loop limiter (65535; our reading, not
// confirmed in Mesa's source). The launcher cuts sequences well below that; the H100 was exact.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "common/bda.glsl"

// d_k, fixed per pipeline: the loops over it unroll and the state column stays in registers (with
// a bound known only at run time the column was indexed dynamically, through memory: the H100
// spent ~7 us per token and layer that way on the tiny hybrid). The sums keep their order.
layout(constant_id = 0) const uint D_K = 128;
layout(local_size_x = 128) in;  // value columns; d_v <= 128
layout(push_constant) uniform Params {
  uint64_t q;            // f32 [tokens, heads, d_k]
  uint64_t k;            // f32 [tokens, heads, d_k]
  uint64_t v;            // f32 [tokens, heads, d_v]
  uint64_t g;            // f32 [tokens, heads], log decays
  uint64_t beta;         // f32 [tokens, heads]
  uint64_t out_;         // f32 [tokens, heads, d_v]
  uint64_t state;        // f32 [slots, heads, d_k, d_v], read and written in place
  uint64_t cu_tokens;    // i32 [sequences + 1]: sequence s is tokens [cu[s], cu[s + 1])
  uint64_t state_slots;  // i32 [sequences]: the state slot of each sequence
  uint heads;
  uint d_k;
  uint d_v;
  float scale;
  uint token_begin;      // within the rows this launch takes of each sequence
  uint token_count;
  uint64_t ranges;       // i32 [sequences, 3]: rows before the chunk form's, in it, after; or 0
  uint part;             // 0: every row; 1: the rows before; 2: the rows after
} pc;

// Element `i` of an f32 array at `base` (arrays of up to 2^32 elements).
float load(uint64_t base, uint64_t i) { return F32Ref(base).v[uint(i)]; }
void store(uint64_t base, uint64_t i, float x) { F32Ref(base).v[uint(i)] = x; }

// A tile of tokens' q and k rows (the same for every column) and their decays and write
// strengths, staged in shared memory by the whole workgroup: the columns read them from there.
#define TILE 16
shared float tile_k[TILE * D_K];
shared float tile_q[TILE * D_K];
shared float tile_a[TILE];
shared float tile_b[TILE];

void main() {
  const uint h = gl_WorkGroupID.x;
  const uint seq = gl_WorkGroupID.y;
  const uint j = gl_LocalInvocationID.x;
  const uint K = D_K, V = pc.d_v, H = pc.heads;
  uint seq_first = uint(I32Ref(pc.cu_tokens).v[seq]);
  uint seq_last = uint(I32Ref(pc.cu_tokens).v[seq + 1]);
  if (pc.part != 0) {  // the rows around the ones the chunk form takes (gated_delta_chunked.comp)
    const uint before = uint(I32Ref(pc.ranges).v[seq * 3]), chunked = uint(I32Ref(pc.ranges).v[seq * 3 + 1]);
    if (pc.part == 1) seq_last = seq_first + before;
    else seq_first = seq_first + before + chunked;
  }
  const uint first = min(seq_first + pc.token_begin, seq_last);
  const uint last = min(first + pc.token_count, seq_last);
  if (first == last) return;  // the whole workgroup: it shares barriers
  const bool column = j < V;
  const uint slot = uint(I32Ref(pc.state_slots).v[seq]);
  const uint64_t state_at = (uint64_t(slot) * H + h) * K * V;  // in floats

  precise float s[D_K];
  if (column) {
    [[unroll]] for (uint i = 0; i < K; ++i) s[i] = load(pc.state, state_at + uint64_t(i) * V + j);
  }
  for (uint t0 = first; t0 < last; t0 += TILE) {
    const uint n = min(TILE, last - t0);
    barrier();  // every column is done with the previous tile
    for (uint e = j; e < n * K; e += gl_WorkGroupSize.x) {
      const uint64_t at = (uint64_t(t0 + e / K) * H + h) * K + e % K;
      tile_k[e] = load(pc.k, at);
      tile_q[e] = load(pc.q, at);
    }
    if (j < n) {
      tile_a[j] = exp(load(pc.g, uint64_t(t0 + j) * H + h));
      tile_b[j] = load(pc.beta, uint64_t(t0 + j) * H + h);
    }
    barrier();
    if (!column) continue;
    for (uint tt = 0; tt < n; ++tt) {
      const uint64_t row_v = (uint64_t(t0 + tt) * H + h) * V;
      const uint row = tt * K;
      const float a = tile_a[tt];
      const float b = tile_b[tt];
      precise float acc = 0.0;
      [[unroll]] for (uint i = 0; i < K; ++i) acc = acc + tile_k[row + i] * s[i];
      precise float ks = a * acc;
      const float vj = load(pc.v, row_v + j);
      [[unroll]] for (uint i = 0; i < K; ++i) s[i] = a * s[i] + b * tile_k[row + i] * (vj - ks);
      precise float o = 0.0;
      [[unroll]] for (uint i = 0; i < K; ++i) o = o + tile_q[row + i] * s[i];
      store(pc.out_, row_v + j, pc.scale * o);
    }
  }
  if (column) {
    [[unroll]] for (uint i = 0; i < K; ++i) store(pc.state, state_at + uint64_t(i) * V + j, s[i]);
  }
}
