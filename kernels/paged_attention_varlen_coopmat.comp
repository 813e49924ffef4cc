#version 460
// paged_attention_varlen_coopmat: paged_attention_varlen on tensor cores (GL_NV_cooperative_matrix,
// f16 inputs, f32 accumulation). Same rows, tiles, grid, splits, partial layout and merge pass as
// the scalar kernel; a different arithmetic, so its own bits — and its own parity contract: a row's
// result depends only on its own tokens, never on what shares its tile or launch, nor on whether
// one workgroup walked its splits or each split had one (the in-kernel merge is the merge pass's
// step, element for element).
//
// A subgroup owns 16 query rows of one query head (subgroup = row block * GQA + head); a
// workgroup holds RB row blocks of every query head of one KV head, so K and V pass through
// shared memory once for all of them. Per CT-key chunk: S = Q K^T on tensor cores, stored to
// shared memory; each row's online softmax there (two lanes per row); weights rounded to f16;
// the running output rescaled per row and O += P V on tensor cores. Splits of SPLIT keys start from
// an empty state and are merged in split order.
//
// f16 inputs: q, K and V are clamped to f16's range (+-65504) and converted with the device's
// rounding (bf16 converts exactly inside f16's normal range; f16 caches are taken as they are).
// A value's row inside an accumulator fragment is implementation-defined, so a matrix of row
// indices, loaded like any accumulator, tells each lane which row each of its elements is in.
#extension GL_GOOGLE_include_directive : require
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#include "common/bda.glsl"
#include "common/dtype.glsl"
#include "common/attention_params.glsl"
#include "common/attention_merge.glsl"

layout(constant_id = 0) const uint WG = 128;  // 32 * RB * GQA
layout(constant_id = 1) const uint HEAD_DIM = 128;
layout(constant_id = 2) const uint BLOCK_SIZE = 16;
layout(constant_id = 3) const uint GQA = 4;
layout(constant_id = 4) const uint RB = 1;
layout(constant_id = 5) const uint DTYPE = DT_BF16;
layout(constant_id = 6) const uint SPLIT = 256;  // a multiple of CT
layout(local_size_x_id = 0) in;

const uint CT = 32;                 // keys per chunk
const uint NSG = WG / 32;           // subgroups of 32 lanes
const uint DT = HEAD_DIM / 16;      // 16-wide tiles across head_dim
const uint QT = 16 * RB;            // rows per tile
const uint EPL = DTYPE == DT_F32 ? 4 : 8;  // elements per 16-byte load
const float F16_MAX = 65504.0;

#define ACC fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>
#define HALF fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>

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

shared float16_t k_s[CT * HEAD_DIM];
shared float16_t v_s[CT * HEAD_DIM];
shared float s_s[NSG * 16 * CT];      // a subgroup's scores; also its staging for f32 tiles
shared float16_t p_s[NSG * 16 * CT];  // a subgroup's weights; also its staging for q
shared float row_s[NSG * 16 * 3];     // per row: factors for the running output, and a mode

float16_t to_half(float x) { return float16_t(clamp(x, -F16_MAX, F16_MAX)); }

// Loads chunk c's keys and values (zeros past the context) into k_s / v_s as f16.
void load_chunk(int c, int seq, int ctx, uint kh, uint tid) {
  const uint64_t row_stride = uint64_t(pc.num_kv_heads) * HEAD_DIM;
  const uint vecs = HEAD_DIM / EPL;
  const uint esize = DTYPE == DT_F32 ? 4 : 2;
  for (uint idx = tid; idx < CT * vecs; idx += WG) {
    const uint t = idx / vecs;
    const uint d0 = (idx % vecs) * EPL;
    const int tok = c * int(CT) + int(t);
    uvec4 kw = uvec4(0), vw = uvec4(0);
    if (tok < ctx) {
      const int blk = I32Ref(pc.block_tables).v[seq * int(pc.max_blocks_per_seq) + tok / int(BLOCK_SIZE)];
      const uint64_t e = (uint64_t(blk) * BLOCK_SIZE + uint(tok) % BLOCK_SIZE) * row_stride + kh * HEAD_DIM + d0;
      kw = U32x4Ref(pc.k_cache + e * esize).v[0];
      vw = U32x4Ref(pc.v_cache + e * esize).v[0];
    }
    const uint at_ = t * HEAD_DIM + d0;
    if (DTYPE == DT_F16) {
      [[unroll]] for (uint w = 0; w < 4; ++w) {
        const f16vec2 kh2 = unpackFloat2x16(kw[w]);
        const f16vec2 vh2 = unpackFloat2x16(vw[w]);
        k_s[at_ + 2 * w] = kh2.x;
        k_s[at_ + 2 * w + 1] = kh2.y;
        v_s[at_ + 2 * w] = vh2.x;
        v_s[at_ + 2 * w + 1] = vh2.y;
      }
    } else {
      float kf[8], vf[8];
      unpack8(kw, DTYPE, kf);
      unpack8(vw, DTYPE, vf);
      [[unroll]] for (uint k = 0; k < EPL; ++k) {
        k_s[at_ + k] = to_half(kf[k]);
        v_s[at_ + k] = to_half(vf[k]);
      }
    }
  }
}

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint sg = tid / 32;
  const uint lane = tid % 32;
  const uint rb = sg / GQA;
  const uint g = sg % GQA;
  const uint kh = gl_WorkGroupID.y;
  const uint num_heads = pc.num_kv_heads * GQA;
  const uint h = kh * GQA + g;
  const int seq = I32Ref(pc.tiles).v[gl_WorkGroupID.x * 2];
  const int row0 = I32Ref(pc.tiles).v[gl_WorkGroupID.x * 2 + 1];
  const int q_start = I32Ref(pc.cu_seqlens_q).v[seq];
  const int q_len = I32Ref(pc.cu_seqlens_q).v[seq + 1] - q_start;
  const int ctx = I32Ref(pc.seq_lens).v[seq];
  const int last_row = min(row0 + int(QT), q_len) - 1;
  const int tile_hi = ctx - q_len + last_row;
  const int tile_lo = pc.window > 0 ? max(ctx - q_len + row0 - pc.window + 1, 0) : 0;
  const bool split_launch = gl_NumWorkGroups.z > 1;
  const int s_first = split_launch ? int(gl_WorkGroupID.z) : tile_lo / int(SPLIT);
  const int s_last = split_launch ? int(gl_WorkGroupID.z) : tile_hi / int(SPLIT);

  // This lane's row (two lanes per row) for the softmax and the writes.
  const uint row = lane / 2;
  const uint half_ = lane % 2;
  const int r = row0 + int(rb * 16 + row);
  const bool valid = r < q_len;
  const int pos = ctx - q_len + r;
  const int lo = pc.window > 0 ? max(pos - pc.window + 1, 0) : 0;
  const uint s_base = sg * 16 * CT;
  const uint r_base = sg * 16 * 3;

  // q as f16 fragments, staged through p_s two 16x16 tiles at a time (16 rows x 32 dims).
  HALF qf[DT];
  const uint64_t qrow = (uint64_t(q_start + (valid ? r : 0)) * num_heads + h) * HEAD_DIM;
  [[unroll]] for (uint j = 0; j < DT; j += 2) {
    for (uint k = 0; k < 16; ++k) {
      const uint d = j * 16 + half_ * 16 + k;
      if (d < HEAD_DIM) p_s[s_base + row * CT + half_ * 16 + k] = to_half(valid ? F32Ref(pc.q + (qrow + d) * 4).v[0] : 0.0);
    }
    subgroupMemoryBarrierShared();
    subgroupBarrier();
    coopMatLoadNV(qf[j], p_s, s_base, CT, false);
    if (j + 1 < DT) coopMatLoadNV(qf[j + 1], p_s, s_base + 16, CT, false);
    subgroupMemoryBarrierShared();
    subgroupBarrier();
  }
  // Row indices of accumulator elements.
  for (uint k = 0; k < 8; ++k) s_s[s_base + lane * 8 + k] = float((lane * 8 + k) / 16);
  subgroupMemoryBarrierShared();
  subgroupBarrier();
  ACC ri;
  coopMatLoadNV(ri, s_s, s_base, 16, false);
  subgroupMemoryBarrierShared();
  subgroupBarrier();

  ACC o[DT], run_o[DT];
  [[unroll]] for (uint j = 0; j < DT; ++j) run_o[j] = ACC(0.0);
  float run_m = NEG_INF;
  precise float run_l = 0.0;

  for (int s = s_first; s <= s_last; ++s) {
    [[unroll]] for (uint j = 0; j < DT; ++j) o[j] = ACC(0.0);
    float m = NEG_INF;
    precise float l = 0.0;
    const int c_first = max(s * int(SPLIT), tile_lo) / int(CT);
    const int c_last = min(s * int(SPLIT) + int(SPLIT) - 1, tile_hi) / int(CT);
    for (int c = c_first; c <= c_last; ++c) {
      barrier();
      load_chunk(c, seq, ctx, kh, tid);
      barrier();
      [[unroll]] for (uint n = 0; n < CT / 16; ++n) {
        ACC sacc = ACC(0.0);
        [[unroll]] for (uint j = 0; j < DT; ++j) {
          HALF kt;
          coopMatLoadNV(kt, k_s, n * 16 * HEAD_DIM + j * 16, HEAD_DIM, true);
          sacc = coopMatMulAddNV(qf[j], kt, sacc);
        }
        coopMatStoreNV(sacc, s_s, s_base + n * 16, CT, false);
      }
      subgroupMemoryBarrierShared();
      subgroupBarrier();
      // Online softmax for this row over the chunk; each lane of the pair takes 16 keys.
      float sc[16];
      float mc = NEG_INF;
      for (uint t = 0; t < 16; ++t) {
        const int tok = c * int(CT) + int(half_ * 16 + t);
        const float raw = s_s[s_base + row * CT + half_ * 16 + t];
        sc[t] = (!valid || tok > pos || tok < lo) ? NEG_INF : attention_score(raw, pc.scale, pc.softcap);
        mc = max(mc, sc[t]);
      }
      mc = max(mc, subgroupShuffleXor(mc, 1));
      const float m_new = max(m, mc);
      const bool none = m_new == NEG_INF;
      const float corr = none ? 1.0 : exp(m - m_new);
      precise float psum = 0.0;
      for (uint t = 0; t < 16; ++t) {
        const float16_t ph = none ? float16_t(0.0) : float16_t(exp(sc[t] - m_new));
        p_s[s_base + row * CT + half_ * 16 + t] = ph;
        psum = psum + float(ph);
      }
      const float other = subgroupShuffleXor(psum, 1);
      precise float tot = half_ == 0 ? psum + other : other + psum;
      l = l * corr + tot;
      m = m_new;
      if (half_ == 0) row_s[r_base + row * 3] = corr;
      subgroupMemoryBarrierShared();
      subgroupBarrier();
      [[unroll]] for (uint j = 0; j < DT; ++j) {
        for (uint i = 0; i < o[j].length(); ++i) {
          precise float x = o[j][i] * row_s[r_base + uint(ri[i]) * 3];
          o[j][i] = x;
        }
      }
      [[unroll]] for (uint kk = 0; kk < CT / 16; ++kk) {
        HALF pm;
        coopMatLoadNV(pm, p_s, s_base + kk * 16, CT, false);
        [[unroll]] for (uint j = 0; j < DT; ++j) {
          HALF vt;
          coopMatLoadNV(vt, v_s, kk * 16 * HEAD_DIM + j * 16, HEAD_DIM, false);
          o[j] = coopMatMulAddNV(pm, vt, o[j]);
        }
      }
    }
    if (split_launch) {
      // This split's state, unnormalized, for the merge pass.
      const uint64_t at_ = ((uint64_t(q_start + r) * num_heads + h) * pc.max_splits + uint(s)) * (HEAD_DIM + 2);
      [[unroll]] for (uint j = 0; j < DT; j += 2) {
        subgroupMemoryBarrierShared();
        subgroupBarrier();
        coopMatStoreNV(o[j], s_s, s_base, CT, false);
        if (j + 1 < DT) coopMatStoreNV(o[j + 1], s_s, s_base + 16, CT, false);
        subgroupMemoryBarrierShared();
        subgroupBarrier();
        for (uint k = 0; k < 16; ++k) {
          const uint d = j * 16 + half_ * 16 + k;
          if (valid && d < HEAD_DIM) F32Ref(pc.partial + (at_ + d) * 4).v[0] = s_s[s_base + row * CT + half_ * 16 + k];
        }
      }
      if (valid && half_ == 0) {
        F32Ref(pc.partial + (at_ + HEAD_DIM) * 4).v[0] = m;
        F32Ref(pc.partial + (at_ + HEAD_DIM + 1) * 4).v[0] = l;
      }
    } else {
      // Merge into the running state: mode 0 skips a split the row does not reach, 1 takes the
      // first one as it is, 2 merges (the merge pass's arithmetic).
      float mode = 0.0, fa = 0.0, fb = 0.0;
      if (l > 0.0) {
        if (run_l == 0.0) {
          mode = 1.0;
          run_m = m;
          run_l = l;
        } else {
          mode = 2.0;
          float mm;
          merge_factors(run_m, m, mm, fa, fb);
          precise float nl = run_l * fa + l * fb;
          run_l = nl;
          run_m = mm;
        }
      }
      subgroupMemoryBarrierShared();
      subgroupBarrier();
      if (half_ == 0) {
        row_s[r_base + row * 3] = fa;
        row_s[r_base + row * 3 + 1] = fb;
        row_s[r_base + row * 3 + 2] = mode;
      }
      subgroupMemoryBarrierShared();
      subgroupBarrier();
      [[unroll]] for (uint j = 0; j < DT; ++j) {
        for (uint i = 0; i < o[j].length(); ++i) {
          const uint rr = r_base + uint(ri[i]) * 3;
          const float md = row_s[rr + 2];
          if (md == 1.0) {
            run_o[j][i] = o[j][i];
          } else if (md == 2.0) {
            precise float na = run_o[j][i] * row_s[rr] + o[j][i] * row_s[rr + 1];
            run_o[j][i] = na;
          }
        }
      }
    }
  }
  if (!split_launch) {
    const uint64_t orow = (uint64_t(q_start + r) * num_heads + h) * HEAD_DIM;
    [[unroll]] for (uint j = 0; j < DT; j += 2) {
      subgroupMemoryBarrierShared();
      subgroupBarrier();
      coopMatStoreNV(run_o[j], s_s, s_base, CT, false);
      if (j + 1 < DT) coopMatStoreNV(run_o[j + 1], s_s, s_base + 16, CT, false);
      subgroupMemoryBarrierShared();
      subgroupBarrier();
      for (uint k = 0; k < 16; ++k) {
        const uint d = j * 16 + half_ * 16 + k;
        if (valid && d < HEAD_DIM) F32Ref(pc.out_ + (orow + d) * 4).v[0] = s_s[s_base + row * CT + half_ * 16 + k] / run_l;
      }
    }
  }
}
