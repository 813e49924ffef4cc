#version 460
// paged_attention_varlen: prefill and decode in one launch. Query rows of many sequences are
// packed back to back (cu_seqlens_q: sequence i's rows are [cu[i], cu[i+1])); seq_lens counts
// every token of a sequence's context, the new rows being its last ones, so row r of a sequence
// with q_len rows sits at position seq_len - q_len + r and attends causally to positions <= it
// (and >= it - window + 1 with a sliding window).
//
// Grid (tile, kv head): a tile is up to QT consecutive rows of ONE sequence; `tiles` (i32 pairs:
// sequence, first row) is built by the launcher, which is how each row finds its sequence. K/V
// arrive in CT-token chunks through shared memory, chunks aligned to absolute positions; each row
// keeps an online softmax over exactly the chunks its window covers, in order. A row's arithmetic
// therefore does not depend on which other rows share its launch or tile: the same tokens give
// the same bits whether a prefix was recomputed or restored from the cache.
//
// Threads: (row, query head of this KV head, P lanes); each lane owns HEAD_DIM / P dimensions
// and the P lanes of a row (adjacent in a subgroup) sum their dot products by butterfly.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_shuffle : require
#include "common/bda.glsl"
#include "common/dtype.glsl"
#include "common/attention_params.glsl"

layout(constant_id = 0) const uint WG = 256;  // QT * GQA * P
layout(constant_id = 1) const uint HEAD_DIM = 128;
layout(constant_id = 2) const uint BLOCK_SIZE = 16;
layout(constant_id = 3) const uint GQA = 4;
layout(constant_id = 4) const uint QT = 16;
layout(constant_id = 5) const uint P = 4;
layout(constant_id = 6) const uint DTYPE = DT_BF16;
layout(local_size_x_id = 0) in;

const uint CT = 16;
const uint DPT = HEAD_DIM / P;

layout(push_constant) uniform Params {
  uint64_t q;             // f32 [total_rows, num_heads, HEAD_DIM]
  uint64_t out_;          // f32 [total_rows, num_heads, HEAD_DIM]
  uint64_t k_cache;
  uint64_t v_cache;
  uint64_t block_tables;  // i32 [num_seqs, max_blocks_per_seq]
  uint64_t seq_lens;      // i32 [num_seqs]
  uint64_t cu_seqlens_q;  // i32 [num_seqs + 1]
  uint64_t tiles;         // i32 [num_tiles, 2]
  uint num_kv_heads;
  uint max_blocks_per_seq;
  float scale;
  float softcap;
  int window;
} pc;

shared float k_s[CT * HEAD_DIM];
shared float v_s[CT * HEAD_DIM];

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint p = tid % P;
  const uint g = (tid / P) % GQA;
  const uint r_local = tid / (P * GQA);
  const uint kh = gl_WorkGroupID.y;
  const uint num_heads = pc.num_kv_heads * GQA;
  const int seq = I32Ref(pc.tiles).v[gl_WorkGroupID.x * 2];
  const int row0 = I32Ref(pc.tiles).v[gl_WorkGroupID.x * 2 + 1];
  const int q_start = I32Ref(pc.cu_seqlens_q).v[seq];
  const int q_len = I32Ref(pc.cu_seqlens_q).v[seq + 1] - q_start;
  const int ctx = I32Ref(pc.seq_lens).v[seq];
  const int r = row0 + int(r_local);
  const bool valid = r < q_len;
  const int pos = ctx - q_len + r;
  const int lo = pc.window > 0 ? max(pos - pc.window + 1, 0) : 0;
  const int last_row = min(row0 + int(QT), q_len) - 1;
  const int tile_hi = ctx - q_len + last_row;
  const int tile_lo = pc.window > 0 ? max(ctx - q_len + row0 - pc.window + 1, 0) : 0;
  const uint h = kh * GQA + g;

  float qr[DPT], acc[DPT];
  const uint64_t qrow = (uint64_t(q_start + (valid ? r : 0)) * num_heads + h) * HEAD_DIM + p * DPT;
  for (uint i = 0; i < DPT; ++i) {
    qr[i] = valid ? F32Ref(pc.q + (qrow + i) * 4).v[0] : 0.0;
    acc[i] = 0.0;
  }
  float m = NEG_INF, l = 0.0;
  const uint64_t row_stride = uint64_t(pc.num_kv_heads) * HEAD_DIM;

  for (int c = tile_lo / int(CT); c <= tile_hi / int(CT); ++c) {
    for (uint idx = tid; idx < CT * HEAD_DIM; idx += WG) {
      const int tok = c * int(CT) + int(idx / HEAD_DIM);
      const uint d = idx % HEAD_DIM;
      float kv = 0.0, vv = 0.0;
      if (tok < ctx) {
        const int blk = I32Ref(pc.block_tables).v[seq * int(pc.max_blocks_per_seq) + tok / int(BLOCK_SIZE)];
        const uint64_t e = (uint64_t(blk) * BLOCK_SIZE + uint(tok) % BLOCK_SIZE) * row_stride +
                           kh * HEAD_DIM + d;
        kv = kv_load(pc.k_cache, DTYPE, e);
        vv = kv_load(pc.v_cache, DTYPE, e);
      }
      k_s[idx] = kv;
      v_s[idx] = vv;
    }
    barrier();
    // Every lane computes (the subgroup stays converged for the shuffles); rows whose window
    // misses this chunk ignore the result.
    float sc[CT];
    for (uint t = 0; t < CT; ++t) {
      float part = 0.0;
      for (uint i = 0; i < DPT; ++i) part += qr[i] * k_s[t * HEAD_DIM + p * DPT + i];
      for (uint o = P / 2; o > 0; o /= 2) part += subgroupShuffleXor(part, o);
      sc[t] = part;
    }
    const bool attends = valid && c * int(CT) <= pos && c * int(CT) + int(CT) - 1 >= lo;
    if (attends) {
      float mc = NEG_INF;
      for (uint t = 0; t < CT; ++t) {
        const int tok = c * int(CT) + int(t);
        sc[t] = (tok > pos || tok < lo) ? NEG_INF : attention_score(sc[t], pc.scale, pc.softcap);
        mc = max(mc, sc[t]);
      }
      const float m_new = max(m, mc);
      const float corr = exp(m - m_new);
      l *= corr;
      for (uint i = 0; i < DPT; ++i) acc[i] *= corr;
      for (uint t = 0; t < CT; ++t) {
        const float pt = exp(sc[t] - m_new);
        l += pt;
        for (uint i = 0; i < DPT; ++i) acc[i] += pt * v_s[t * HEAD_DIM + p * DPT + i];
      }
      m = m_new;
    }
    barrier();
  }
  if (valid) {
    const uint64_t orow = (uint64_t(q_start + r) * num_heads + h) * HEAD_DIM + p * DPT;
    for (uint i = 0; i < DPT; ++i) F32Ref(pc.out_ + (orow + i) * 4).v[0] = acc[i] / l;
  }
}
