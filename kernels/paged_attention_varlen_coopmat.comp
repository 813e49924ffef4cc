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
#extension GL_KHR_shader_subgroup_vote : require
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
// Row strides in shared memory, padded so a tile's 16 rows fall on different banks (unpadded, a
// 256-byte K row put every row of a tile load on the same bank).
const uint KS = HEAD_DIM + 8;       // k_s, v_s (f16)
const uint SS = CT + 4;             // s_s (f32)
const uint PS = CT + 8;             // p_s (f16)
const uint DT = HEAD_DIM / 16;      // 16-wide tiles across head_dim
const uint QT = 16 * RB;            // rows per tile
const uint EPL = DTYPE == DT_F32 ? 4 : 8;  // elements per 16-byte load
const uint VECS = HEAD_DIM / EPL;          // 16-byte loads per key row
const uint NL = (CT * VECS + WG - 1) / WG; // loads per thread per chunk, for K and for V
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

shared float16_t k_s[CT * KS];
shared float16_t v_s[CT * KS];
shared float s_s[NSG * 16 * SS];      // a subgroup's scores; also its staging for f32 tiles
shared float16_t p_s[NSG * 16 * PS];  // a subgroup's weights; also its staging for q
shared float row_s[NSG * 16 * 3];     // per row: factors for the running output, and a mode

float16_t to_half(float x) { return float16_t(clamp(x, -F16_MAX, F16_MAX)); }

// A chunk's keys and values travel in two steps, so the next chunk's global loads are in flight
// while this one is computed: fetch_chunk (global memory to registers; zeros past the context),
// then store_chunk (registers to k_s / v_s as f16).
uvec4 kw[NL], vw[NL];

void fetch_chunk(int c, int seq, int ctx, uint kh, uint tid) {
  const uint64_t row_stride = uint64_t(pc.num_kv_heads) * HEAD_DIM;
  const uint esize = DTYPE == DT_F32 ? 4 : 2;
  [[unroll]] for (uint n = 0; n < NL; ++n) {
    const uint idx = tid + n * WG;
    const uint t = idx / VECS;
    const int tok = c * int(CT) + int(t);
    kw[n] = uvec4(0);
    vw[n] = uvec4(0);
    if (idx < CT * VECS && tok < ctx) {
      const int blk = I32Ref(pc.block_tables).v[seq * int(pc.max_blocks_per_seq) + tok / int(BLOCK_SIZE)];
      const uint64_t e = (uint64_t(blk) * BLOCK_SIZE + uint(tok) % BLOCK_SIZE) * row_stride + kh * HEAD_DIM +
                         (idx % VECS) * EPL;
      kw[n] = U32x4Ref(pc.k_cache + e * esize).v[0];
      vw[n] = U32x4Ref(pc.v_cache + e * esize).v[0];
    }
  }
}

void store_chunk(uint tid) {
  [[unroll]] for (uint n = 0; n < NL; ++n) {
    const uint idx = tid + n * WG;
    if (idx >= CT * VECS) break;
    const uint at_ = (idx / VECS) * KS + (idx % VECS) * EPL;
    if (DTYPE == DT_F16) {
      [[unroll]] for (uint w = 0; w < 4; ++w) {
        const f16vec2 kh2 = unpackFloat2x16(kw[n][w]);
        const f16vec2 vh2 = unpackFloat2x16(vw[n][w]);
        k_s[at_ + 2 * w] = kh2.x;
        k_s[at_ + 2 * w + 1] = kh2.y;
        v_s[at_ + 2 * w] = vh2.x;
        v_s[at_ + 2 * w + 1] = vh2.y;
      }
    } else {
      float kf[8], vf[8];
      unpack8(kw[n], DTYPE, kf);
      unpack8(vw[n], DTYPE, vf);
      [[unroll]] for (uint k = 0; k < EPL; ++k) {
        k_s[at_ + k] = to_half(kf[k]);
        v_s[at_ + k] = to_half(vf[k]);
      }
    }
  }
}

// Writes a subgroup's 16 x HEAD_DIM accumulator tiles, two at a time through s_s, as rows of f32:
// row `row` of the tile (this lane's, two lanes per row: dimensions half_ * 16 + 32 i + [0, 16))
// goes to dst + d, divided by `div` when `normalize` (the merge pass's division).
void write_rows(ACC t[DT], uint s_base, uint row, uint half_, bool valid, uint64_t dst, bool normalize, float div) {
  [[unroll]] for (uint j = 0; j < DT; j += 2) {
    subgroupMemoryBarrierShared();
    subgroupBarrier();
    coopMatStoreNV(t[j], s_s, s_base, SS, false);
    if (j + 1 < DT) coopMatStoreNV(t[j + 1], s_s, s_base + 16, SS, false);
    subgroupMemoryBarrierShared();
    subgroupBarrier();
    for (uint k = 0; k < 16; ++k) {
      const uint d = j * 16 + half_ * 16 + k;
      const float x = s_s[s_base + row * SS + half_ * 16 + k];
      if (valid && d < HEAD_DIM) F32Ref(dst + d * 4).v[0] = normalize ? x / div : x;
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
  // The chunks this workgroup computes: the tile's key range, within one split in a split launch.
  int key_lo = tile_lo, key_hi = tile_hi;
  if (split_launch) {
    key_lo = max(key_lo, int(gl_WorkGroupID.z * SPLIT));
    key_hi = min(key_hi, int(gl_WorkGroupID.z * SPLIT + SPLIT) - 1);
  }
  const int c_lo = key_lo / int(CT);
  const int c_hi = key_hi < key_lo ? c_lo - 1 : key_hi / int(CT);
  if (c_lo <= c_hi) fetch_chunk(c_lo, seq, ctx, kh, tid);

  // This lane's row (two lanes per row) for the softmax and the writes.
  const uint row = lane / 2;
  const uint half_ = lane % 2;
  const int r = row0 + int(rb * 16 + row);
  const bool valid = r < q_len;
  const int pos = ctx - q_len + r;
  const int lo = pc.window > 0 ? max(pos - pc.window + 1, 0) : 0;
  const uint s_base = sg * 16 * SS;
  const uint p_base = sg * 16 * PS;
  const uint r_base = sg * 16 * 3;

  // q as f16 fragments, staged through p_s two 16x16 tiles at a time (16 rows x 32 dims).
  HALF qf[DT];
  const uint64_t qrow = (uint64_t(q_start + (valid ? r : 0)) * num_heads + h) * HEAD_DIM;
  [[unroll]] for (uint j = 0; j < DT; j += 2) {
    for (uint k = 0; k < 16; ++k) {
      const uint d = j * 16 + half_ * 16 + k;
      if (d < HEAD_DIM) p_s[p_base + row * PS + half_ * 16 + k] = to_half(valid ? F32Ref(pc.q + (qrow + d) * 4).v[0] : 0.0);
    }
    subgroupMemoryBarrierShared();
    subgroupBarrier();
    coopMatLoadNV(qf[j], p_s, p_base, PS, false);
    if (j + 1 < DT) coopMatLoadNV(qf[j + 1], p_s, p_base + 16, PS, false);
    subgroupMemoryBarrierShared();
    subgroupBarrier();
  }
  // Which row each of this lane's accumulator elements is in (the same for every f32 tile).
  for (uint k = 0; k < 8; ++k) s_s[s_base + (lane * 8 + k) / 16 * SS + (lane * 8 + k) % 16] = float((lane * 8 + k) / 16);
  subgroupMemoryBarrierShared();
  subgroupBarrier();
  ACC ri;
  coopMatLoadNV(ri, s_s, s_base, SS, false);
  uint erow[8];
  for (uint i = 0; i < ri.length(); ++i) erow[i] = r_base + uint(ri[i]) * 3;
  subgroupMemoryBarrierShared();
  subgroupBarrier();

  ACC o[DT], run_o[DT];
  [[unroll]] for (uint j = 0; j < DT; ++j) run_o[j] = ACC(0.0);
  float run_m = NEG_INF;
  precise float run_l = 0.0;
  float m = NEG_INF;
  precise float l = 0.0;

  for (int c = c_lo; c <= c_hi; ++c) {
    const int s = c * int(CT) / int(SPLIT);
    if (c == c_lo || c * int(CT) % int(SPLIT) == 0) {  // a split starts from an empty state
      [[unroll]] for (uint j = 0; j < DT; ++j) o[j] = ACC(0.0);
      m = NEG_INF;
      l = 0.0;
    }
    barrier();  // every subgroup is done with the previous chunk
    store_chunk(tid);
    barrier();
    if (c < c_hi) fetch_chunk(c + 1, seq, ctx, kh, tid);
    [[unroll]] for (uint n = 0; n < CT / 16; ++n) {
      ACC sacc = ACC(0.0);
      [[unroll]] for (uint j = 0; j < DT; ++j) {
        HALF kt;
        coopMatLoadNV(kt, k_s, n * 16 * KS + j * 16, KS, true);
        sacc = coopMatMulAddNV(qf[j], kt, sacc);
      }
      coopMatStoreNV(sacc, s_s, s_base + n * 16, SS, false);
    }
    subgroupMemoryBarrierShared();
    subgroupBarrier();
    // Online softmax for this row over the chunk; each lane of the pair takes 16 keys.
    float sc[16];
    float mc = NEG_INF;
    for (uint t = 0; t < 16; ++t) {
      const int tok = c * int(CT) + int(half_ * 16 + t);
      const float raw = s_s[s_base + row * SS + half_ * 16 + t];
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
      p_s[p_base + row * PS + half_ * 16 + t] = ph;
      psum = psum + float(ph);
    }
    const float other = subgroupShuffleXor(psum, 1);
    precise float tot = half_ == 0 ? psum + other : other + psum;
    l = l * corr + tot;
    m = m_new;
    // Rescale the running output where a row's maximum moved (x * 1 is x: skipping is exact).
    const bool rescale = !subgroupAll(corr == 1.0);
    if (rescale && half_ == 0) row_s[r_base + row * 3] = corr;
    subgroupMemoryBarrierShared();
    subgroupBarrier();
    if (rescale) {
      float ce[8];
      for (uint i = 0; i < ri.length(); ++i) ce[i] = row_s[erow[i]];
      [[unroll]] for (uint j = 0; j < DT; ++j) {
        for (uint i = 0; i < o[j].length(); ++i) {
          precise float x = o[j][i] * ce[i];
          o[j][i] = x;
        }
      }
    }
    [[unroll]] for (uint kk = 0; kk < CT / 16; ++kk) {
      HALF pm;
      coopMatLoadNV(pm, p_s, p_base + kk * 16, PS, false);
      [[unroll]] for (uint j = 0; j < DT; ++j) {
        HALF vt;
        coopMatLoadNV(vt, v_s, kk * 16 * KS + j * 16, KS, false);
        o[j] = coopMatMulAddNV(pm, vt, o[j]);
      }
    }
    if (c < c_hi && (c + 1) * int(CT) % int(SPLIT) != 0) continue;
    // The split ends here.
    if (split_launch) {
      // Its state, unnormalized, for the merge pass.
      const uint64_t at_ = ((uint64_t(q_start + r) * num_heads + h) * pc.max_splits + uint(s)) * (HEAD_DIM + 2);
      write_rows(o, s_base, row, half_, valid, pc.partial + at_ * 4, false, 1.0);
      if (valid && half_ == 0) {
        F32Ref(pc.partial + (at_ + HEAD_DIM) * 4).v[0] = m;
        F32Ref(pc.partial + (at_ + HEAD_DIM + 1) * 4).v[0] = l;
      }
      continue;
    }
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
        const float md = row_s[erow[i] + 2];
        if (md == 1.0) {
          run_o[j][i] = o[j][i];
        } else if (md == 2.0) {
          precise float na = run_o[j][i] * row_s[erow[i]] + o[j][i] * row_s[erow[i] + 1];
          run_o[j][i] = na;
        }
      }
    }
  }
  if (split_launch) {
    if (c_lo > c_hi) {  // a split the tile does not reach: an empty state
      const uint64_t at_ = ((uint64_t(q_start + r) * num_heads + h) * pc.max_splits + gl_WorkGroupID.z) * (HEAD_DIM + 2);
      [[unroll]] for (uint j = 0; j < DT; ++j) o[j] = ACC(0.0);
      write_rows(o, s_base, row, half_, valid, pc.partial + at_ * 4, false, 1.0);
      if (valid && half_ == 0) {
        F32Ref(pc.partial + (at_ + HEAD_DIM) * 4).v[0] = NEG_INF;
        F32Ref(pc.partial + (at_ + HEAD_DIM + 1) * 4).v[0] = 0.0;
      }
    }
    return;
  }
  write_rows(run_o, s_base, row, half_, valid, pc.out_ + (uint64_t(q_start + r) * num_heads + h) * HEAD_DIM * 4,
             true, run_l);
}
