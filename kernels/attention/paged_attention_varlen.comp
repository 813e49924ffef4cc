#version 460
// paged_attention_varlen: prefill and decode in one launch. Query rows of many sequences are
// packed back to back (cu_seqlens_q: sequence i's rows are [cu[i], cu[i+1])); seq_lens counts
// every token of a sequence's context, the new rows being its last ones, so row r of a sequence
// with q_len rows sits at position seq_len - q_len + r and attends causally to positions <= it
// (and >= it - window + 1 with a sliding window).
//
// Grid (kv head, tile, split): a tile is up to QT consecutive rows of ONE sequence; `tiles` (i32
// pairs: sequence, first row) is built by the launcher, which is how each row finds its sequence.
// Keys are cut at fixed absolute positions into splits of SPLIT tokens and, inside a split, into
// CT-token chunks that pass through shared memory. A row keeps one online softmax per split (its
// chunks in order) and merges the splits in order. Either this workgroup walks every split
// (gl_NumWorkGroups.z == 1) or each workgroup takes one split and writes its state to `partial`
// for paged_attention_varlen_merge, which merges them the same way — the launcher picks by how
// many workgroups the batch would otherwise have. A row's arithmetic never depends on the other
// rows of its launch, its tile, or that choice: the same tokens give the same bits whether a
// prefix was recomputed or restored, and whether a token was prefilled or decoded.
//
// Threads: (row, query head of this KV head, P lanes); each lane owns HEAD_DIM / P dimensions
// and the P lanes of a row (adjacent in a subgroup) sum their dot products by butterfly. All
// arithmetic is `precise`: no contraction, so every pipeline specialization rounds alike.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_shuffle : require
#include "common/bda.glsl"
#include "common/dtype.glsl"
#include "common/attention_params.glsl"
#include "common/attention_merge.glsl"

layout(constant_id = 0) const uint WG = 256;  // QT * GQA * P
layout(constant_id = 1) const uint HEAD_DIM = 128;
layout(constant_id = 2) const uint BLOCK_SIZE = 16;
layout(constant_id = 3) const uint GQA = 4;
layout(constant_id = 4) const uint QT = 16;
layout(constant_id = 5) const uint P = 4;
layout(constant_id = 6) const uint DTYPE = DT_BF16;
layout(constant_id = 7) const uint SPLIT = 256;  // a multiple of CT
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
  uint64_t partial;       // f32 [total_rows, num_heads, max_splits, HEAD_DIM + 2] (split launch)
  uint num_kv_heads;
  uint max_blocks_per_seq;
  float scale;
  float softcap;
  int window;
  uint max_splits;
} pc;

shared float k_s[CT * HEAD_DIM];
shared float v_s[CT * HEAD_DIM];

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint p = tid % P;
  const uint g = (tid / P) % GQA;
  const uint r_local = tid / (P * GQA);
  const uint kh = gl_WorkGroupID.x;  // KV heads fastest: see the launcher
  const uint num_heads = pc.num_kv_heads * GQA;
  const int seq = I32Ref(pc.tiles).v[gl_WorkGroupID.y * 2];
  const int row0 = I32Ref(pc.tiles).v[gl_WorkGroupID.y * 2 + 1];
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
  const bool split_launch = gl_NumWorkGroups.z > 1;
  const int s_first = split_launch ? int(gl_WorkGroupID.z) : tile_lo / int(SPLIT);
  const int s_last = split_launch ? int(gl_WorkGroupID.z) : tile_hi / int(SPLIT);

  float qr[DPT];
  precise float acc[DPT], run_acc[DPT];
  const uint64_t qrow = (uint64_t(q_start + (valid ? r : 0)) * num_heads + h) * HEAD_DIM + p * DPT;
  for (uint i = 0; i < DPT; ++i) {
    qr[i] = valid ? F32Ref(pc.q + (qrow + i) * 4).v[0] : 0.0;
    run_acc[i] = 0.0;
  }
  float run_m = NEG_INF;
  precise float run_l = 0.0;
  const uint64_t row_stride = uint64_t(pc.num_kv_heads) * HEAD_DIM;

  for (int s = s_first; s <= s_last; ++s) {
    float m = NEG_INF;
    precise float l = 0.0;
    for (uint i = 0; i < DPT; ++i) acc[i] = 0.0;
    const int c_first = max(s * int(SPLIT), tile_lo) / int(CT);
    const int c_last = min(s * int(SPLIT) + int(SPLIT) - 1, tile_hi) / int(CT);
    for (int c = c_first; c <= c_last; ++c) {
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
        precise float part = 0.0;
        for (uint i = 0; i < DPT; ++i) {
          precise float prod = qr[i] * k_s[t * HEAD_DIM + p * DPT + i];
          part = part + prod;
        }
        for (uint o = P / 2; o > 0; o /= 2) part = part + subgroupShuffleXor(part, o);
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
        l = l * corr;
        for (uint i = 0; i < DPT; ++i) acc[i] = acc[i] * corr;
        for (uint t = 0; t < CT; ++t) {
          const float pt = exp(sc[t] - m_new);
          l = l + pt;
          for (uint i = 0; i < DPT; ++i) {
            precise float w = pt * v_s[t * HEAD_DIM + p * DPT + i];
            acc[i] = acc[i] + w;
          }
        }
        m = m_new;
      }
      barrier();
    }
    if (split_launch) {
      if (valid) {
        const uint64_t at_ = ((uint64_t(q_start + r) * num_heads + h) * pc.max_splits + uint(s)) * (HEAD_DIM + 2);
        for (uint i = 0; i < DPT; ++i) F32Ref(pc.partial + (at_ + p * DPT + i) * 4).v[0] = acc[i];
        if (p == 0) {
          F32Ref(pc.partial + (at_ + HEAD_DIM) * 4).v[0] = m;
          F32Ref(pc.partial + (at_ + HEAD_DIM + 1) * 4).v[0] = l;
        }
      }
    } else if (l > 0.0) {
      if (run_l == 0.0) {
        run_m = m;
        run_l = l;
        for (uint i = 0; i < DPT; ++i) run_acc[i] = acc[i];
      } else {
        float mm, fa, fb;
        merge_factors(run_m, m, mm, fa, fb);
        precise float nl = run_l * fa + l * fb;
        run_l = nl;
        for (uint i = 0; i < DPT; ++i) {
          precise float na = run_acc[i] * fa + acc[i] * fb;
          run_acc[i] = na;
        }
        run_m = mm;
      }
    }
  }
  if (!split_launch && valid) {
    const uint64_t orow = (uint64_t(q_start + r) * num_heads + h) * HEAD_DIM + p * DPT;
    for (uint i = 0; i < DPT; ++i) F32Ref(pc.out_ + (orow + i) * 4).v[0] = run_acc[i] / run_l;
  }
}
