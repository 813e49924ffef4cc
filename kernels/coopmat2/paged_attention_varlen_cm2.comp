#version 460
// paged_attention_varlen_cm2: paged_attention_varlen on tensor cores through
// GL_NV_cooperative_matrix2 — workgroup-scope matrices, row reductions and per-element functions,
// so the online softmax runs on whole tiles without a fragment layout of our own. Compiled only by
// a glslang that knows the extension (>= 15.1, scripts/glslang.sh); used only on devices with
// VK_NV_cooperative_matrix2.
//
// A workgroup owns QT query tokens of one sequence for every query head of one KV head: its
// matrices have BR = GQA * QT rows, row r being head r / QT, token r % QT, so each K/V chunk
// goes through shared memory once for all GQA heads. Per CT-key chunk: S = Q K^T; scores scaled,
// soft-capped and masked by a per-element function; row maxima by a row reduction; P = e^(S - M)
// and the row sums as P times a ones matrix on the tensor cores; O = diag(e^(M_old - M)) O + P V.
// Same grid, splits, partial layout and merge as the scalar kernel: splits of SPLIT keys start
// from an empty state and are merged in split order with common/attention_merge.glsl's step, in
// the kernel or by the merge pass, to the same bits. A row's arithmetic depends only on its own
// tokens: what shares its tile or launch changes neither its chunks nor its splits.
//
// f16 inputs, f32 accumulation: q, K and V are clamped to f16's range (+-65504) and converted
// with the device's rounding, as in paged_attention_varlen_coopmat (bf16 converts exactly inside
// f16's normal range).
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_NV_cooperative_matrix2 : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_control_flow_attributes : require
#include "common/bda.glsl"
#include "common/dtype.glsl"
#include "common/attention_params.glsl"
#include "common/attention_merge.glsl"
#include "common/half_pack.glsl"

layout(constant_id = 0) const uint WG = 256;
layout(constant_id = 1) const uint HEAD_DIM = 128;
layout(constant_id = 2) const uint BLOCK_SIZE = 16;
layout(constant_id = 3) const uint GQA = 4;
layout(constant_id = 4) const uint QT = 16;  // query tokens per tile
layout(constant_id = 5) const uint DTYPE = DT_BF16;
layout(constant_id = 6) const uint SPLIT = 256;  // a multiple of CT
layout(constant_id = 7) const uint CT = 64;      // keys per chunk; BR <= CT (q is staged in k_s)
layout(local_size_x_id = 0) in;

const uint BR = GQA * QT;
const uint KS4 = HEAD_DIM / 8 + 1;  // k_s, v_s row stride in uvec4s (8 f16), padded off the banks' period
const uint EPL = DTYPE == DT_F32 ? 4 : 8;
const uint VECS = HEAD_DIM / EPL;
const uint NL = (CT * VECS + WG - 1) / WG;
// The running maximum starts here, not at -inf: e^(S - M) and e^(M_old - M) stay defined (0 or
// 1) for rows no key has reached yet. A row's maximum over real scores is never below it.
const float NO_MAX = -1.7014118e38;  // -FLT_MAX / 2

// Per-row statistics are held at the scores' width (every column of a row the same) and spread to
// the output's width by a row reduction that keeps the first value. Narrower BR x 16 statistics
// (fewer registers) made the H100 driver's compiler crash at pipeline creation (580.159.04).
#define ROWS_KEYS coopmat<float, gl_ScopeWorkgroup, BR, CT, gl_MatrixUseAccumulator>
#define ROWS_DIMS coopmat<float, gl_ScopeWorkgroup, BR, HEAD_DIM, gl_MatrixUseAccumulator>

layout(push_constant) uniform Params {
  uint64_t q;
  uint64_t out_;
  uint64_t k_cache;
  uint64_t v_cache;
  uint64_t block_tables;
  uint64_t seq_lens;
  uint64_t cu_seqlens_q;
  uint64_t tiles;
  uint64_t partial;
  uint num_kv_heads;
  uint max_blocks_per_seq;
  float scale;
  float softcap;
  int window;
  uint max_splits;
} pc;

shared uvec4 k_s[CT * KS4];
shared uvec4 v_s[CT * KS4];

// A chunk's keys and values, gathered from their cache blocks, as f16 rows of k_s / v_s.
void stage_chunk(int c, int seq, int ctx, uint kh, uint tid) {
  const uint64_t row_stride = uint64_t(pc.num_kv_heads) * HEAD_DIM;
  const uint esize = DTYPE == DT_F32 ? 4 : 2;
  uvec4 kw[NL], vw[NL];
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
  barrier();  // every invocation is done reading the previous chunk
  [[unroll]] for (uint n = 0; n < NL; ++n) {
    const uint idx = tid + n * WG;
    if (idx >= CT * VECS) break;
    const uint t = idx / VECS, v = idx % VECS;
    if (DTYPE == DT_F16) {
      k_s[t * KS4 + v] = kw[n];
      v_s[t * KS4 + v] = vw[n];
    } else if (DTYPE == DT_BF16) {
      k_s[t * KS4 + v] = half8_from_bf16(kw[n]);
      v_s[t * KS4 + v] = half8_from_bf16(vw[n]);
    } else {  // f32: 4 values, half a uvec4
      const uint at_ = t * KS4 + v / 2, w = (v % 2) * 2;
      const uvec2 kp = half4_from_f32(kw[n]), vp = half4_from_f32(vw[n]);
      k_s[at_][w] = kp.x;
      k_s[at_][w + 1] = kp.y;
      v_s[at_][w] = vp.x;
      v_s[at_][w + 1] = vp.y;
    }
  }
  barrier();
}

// Per-element functions (row, column, element, arguments...).

// A score in natural units, or -inf where the key is masked for the row's token: past its
// position (causal), before its window, or the row past the sequence's queries.
float masked_score(const in uint r, const in uint col, const in float dot, const in int key0, const in int row0,
                   const in int q_len, const in int ctx) {
  const int row = row0 + int(r % QT);
  const int pos = ctx - q_len + row;
  const int tok = key0 + int(col);
  const int lo = pc.window > 0 ? max(pos - pc.window + 1, 0) : 0;
  if (row >= q_len || tok > pos || tok < lo) return NEG_INF;
  return attention_score(dot, pc.scale, pc.softcap);
}
float scaled_score(const in uint r, const in uint col, const in float dot) {
  return attention_score(dot, pc.scale, pc.softcap);
}
float row_max(const in float a, const in float b) { return max(a, b); }
float smear(const in float a, const in float b) { return a; }
float larger(const in uint r, const in uint col, const in float a, const in float b) { return max(a, b); }
float exp_of(const in uint r, const in uint col, const in float x) { return exp(x); }

// Split-launch partials: the split's unnormalized output rows, then (m, l) from column 0.
float store_partial_o(const in uint r, const in uint col, const in float x, const in int row0, const in int q_len,
                      const in int q_start, const in uint kh, const in uint split) {
  const int row = row0 + int(r % QT);
  if (row < q_len) {
    const uint64_t orow = uint64_t(q_start + row) * (pc.num_kv_heads * GQA) + kh * GQA + r / QT;
    F32Ref(pc.partial + ((orow * pc.max_splits + split) * (HEAD_DIM + 2) + col) * 4).v[0] = x;
  }
  return x;
}
float store_partial_ml(const in uint r, const in uint col, const in float l, const in float m, const in int row0,
                       const in int q_len, const in int q_start, const in uint kh, const in uint split) {
  const int row = row0 + int(r % QT);
  if (col == 0 && row < q_len) {
    const uint64_t orow = uint64_t(q_start + row) * (pc.num_kv_heads * GQA) + kh * GQA + r / QT;
    const uint64_t at_ = (orow * pc.max_splits + split) * (HEAD_DIM + 2) + HEAD_DIM;
    F32Ref(pc.partial + at_ * 4).v[0] = l > 0.0 ? m : NEG_INF;
    F32Ref(pc.partial + (at_ + 1) * 4).v[0] = l;
  }
  return l;
}
// The normalized output row (o / l, the merge pass's last step).
float store_out(const in uint r, const in uint col, const in float o, const in float l, const in int row0,
                const in int q_len, const in int q_start, const in uint kh) {
  const int row = row0 + int(r % QT);
  if (row < q_len) {
    const uint64_t orow = uint64_t(q_start + row) * (pc.num_kv_heads * GQA) + kh * GQA + r / QT;
    F32Ref(pc.out_ + (orow * HEAD_DIM + col) * 4).v[0] = o / l;
  }
  return o;
}

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint kh = gl_WorkGroupID.x;  // KV heads fastest: see the launcher
  const uint num_heads = pc.num_kv_heads * GQA;
  const int seq = I32Ref(pc.tiles).v[gl_WorkGroupID.y * 2];
  const int row0 = I32Ref(pc.tiles).v[gl_WorkGroupID.y * 2 + 1];
  const int q_start = I32Ref(pc.cu_seqlens_q).v[seq];
  const int q_len = I32Ref(pc.cu_seqlens_q).v[seq + 1] - q_start;
  const int ctx = I32Ref(pc.seq_lens).v[seq];
  const int last_row = min(row0 + int(QT), q_len) - 1;
  const int tile_hi = ctx - q_len + last_row;
  const int tile_lo = pc.window > 0 ? max(ctx - q_len + row0 - pc.window + 1, 0) : 0;
  const bool split_launch = gl_NumWorkGroups.z > 1;
  int key_lo = tile_lo, key_hi = tile_hi;
  if (split_launch) {
    key_lo = max(key_lo, int(gl_WorkGroupID.z * SPLIT));
    key_hi = min(key_hi, int(gl_WorkGroupID.z * SPLIT + SPLIT) - 1);
  }
  const int c_lo = key_lo / int(CT);
  const int c_hi = key_hi < key_lo ? c_lo - 1 : key_hi / int(CT);

  // q as f16, staged in k_s (BR <= CT rows), row r = head r / QT, token r % QT.
  for (uint idx = tid; idx < BR * (HEAD_DIM / 8); idx += WG) {
    const uint r = idx / (HEAD_DIM / 8), v = idx % (HEAD_DIM / 8);
    const int row = row0 + int(r % QT);
    uvec4 packed = uvec4(0);
    if (row < q_len) {
      const uint64_t at_ = ((uint64_t(q_start + row) * num_heads + kh * GQA + r / QT) * HEAD_DIM + v * 8) * 4;
      const vec4 a = uintBitsToFloat(U32x4Ref(pc.q + at_).v[0]);
      const vec4 b = uintBitsToFloat(U32x4Ref(pc.q + at_ + 16).v[0]);
      packed = uvec4(pack_half2(a.x, a.y), pack_half2(a.z, a.w), pack_half2(b.x, b.y), pack_half2(b.z, b.w));
    }
    k_s[r * KS4 + v] = packed;
  }
  barrier();
  coopmat<float16_t, gl_ScopeWorkgroup, BR, HEAD_DIM, gl_MatrixUseA> qm;
  coopMatLoad(qm, k_s, 0, KS4, gl_CooperativeMatrixLayoutRowMajor);

  const coopmat<float16_t, gl_ScopeWorkgroup, CT, CT, gl_MatrixUseB> ones =
      coopmat<float16_t, gl_ScopeWorkgroup, CT, CT, gl_MatrixUseB>(1.0);
  // Whole chunks (every row of the tile sees every key) skip the mask.
  const bool rows_whole = row0 + int(QT) <= q_len;
  const int first_pos = ctx - q_len + row0, last_pos = ctx - q_len + row0 + int(QT) - 1;

  ROWS_DIMS o, run_o = ROWS_DIMS(0.0);
  ROWS_KEYS m, l, run_m = ROWS_KEYS(NEG_INF), run_l = ROWS_KEYS(0.0);

  for (int c = c_lo; c <= c_hi; ++c) {
    const int s = c * int(CT) / int(SPLIT);
    if (c == c_lo || c * int(CT) % int(SPLIT) == 0) {  // a split starts from an empty state
      o = ROWS_DIMS(0.0);
      l = ROWS_KEYS(0.0);
      m = ROWS_KEYS(NO_MAX);
    }
    stage_chunk(c, seq, ctx, kh, tid);
    coopmat<float16_t, gl_ScopeWorkgroup, HEAD_DIM, CT, gl_MatrixUseB> kt;
    coopMatLoad(kt, k_s, 0, KS4, gl_CooperativeMatrixLayoutColumnMajor);
    ROWS_KEYS sc = ROWS_KEYS(0.0);
    sc = coopMatMulAdd(qm, kt, sc);
    const int key0 = c * int(CT);
    const bool whole = rows_whole && key0 + int(CT) - 1 <= first_pos &&
                       (pc.window <= 0 || key0 >= last_pos - pc.window + 1);
    if (whole) {
      coopMatPerElementNV(sc, sc, scaled_score);
    } else {
      coopMatPerElementNV(sc, sc, masked_score, key0, row0, q_len, ctx);
    }
    ROWS_KEYS chunk_max, m_new, corr;
    coopMatReduceNV(chunk_max, sc, gl_CooperativeMatrixReduceRowNV, row_max);
    coopMatPerElementNV(m_new, chunk_max, larger, m);
    coopMatPerElementNV(corr, m - m_new, exp_of);
    m = m_new;
    ROWS_KEYS p;
    coopMatPerElementNV(p, sc - m_new, exp_of);
    const coopmat<float16_t, gl_ScopeWorkgroup, BR, CT, gl_MatrixUseA> pa =
        coopmat<float16_t, gl_ScopeWorkgroup, BR, CT, gl_MatrixUseA>(p);
    ROWS_KEYS sums = ROWS_KEYS(0.0);
    sums = coopMatMulAdd(pa, ones, sums);
    [[unroll]] for (uint i = 0; i < l.length(); ++i) {
      precise float x = l[i] * corr[i] + sums[i];
      l[i] = x;
    }
    {
      ROWS_DIMS corr_d;
      coopMatReduceNV(corr_d, corr, gl_CooperativeMatrixReduceRowNV, smear);
      [[unroll]] for (uint i = 0; i < o.length(); ++i) {
        precise float x = o[i] * corr_d[i];
        o[i] = x;
      }
    }
    coopmat<float16_t, gl_ScopeWorkgroup, CT, HEAD_DIM, gl_MatrixUseB> vm;
    coopMatLoad(vm, v_s, 0, KS4, gl_CooperativeMatrixLayoutRowMajor);
    o = coopMatMulAdd(pa, vm, o);

    if (c < c_hi && (c + 1) * int(CT) % int(SPLIT) != 0) continue;
    // The split ends here.
    if (split_launch) {
      coopMatPerElementNV(o, o, store_partial_o, row0, q_len, q_start, kh, uint(s));
      coopMatPerElementNV(l, l, store_partial_ml, m, row0, q_len, q_start, kh, uint(s));
      continue;
    }
    // Merge into the running state (the merge pass's arithmetic): skip a split the row does not
    // reach (fb = -1), take the first one as it is (fb = -2), merge the others (fa, fb >= 0).
    ROWS_KEYS fa = ROWS_KEYS(0.0), fb = ROWS_KEYS(-1.0);
    [[unroll]] for (uint i = 0; i < l.length(); ++i) {
      if (l[i] > 0.0) {
        if (run_l[i] == 0.0) {
          fb[i] = -2.0;
          run_m[i] = m[i];
          run_l[i] = l[i];
        } else {
          float mm, a, b;
          merge_factors(run_m[i], m[i], mm, a, b);
          fa[i] = a;
          fb[i] = b;
          precise float nl = run_l[i] * a + l[i] * b;
          run_l[i] = nl;
          run_m[i] = mm;
        }
      }
    }
    ROWS_DIMS fa_d, fb_d;
    coopMatReduceNV(fa_d, fa, gl_CooperativeMatrixReduceRowNV, smear);
    coopMatReduceNV(fb_d, fb, gl_CooperativeMatrixReduceRowNV, smear);
    [[unroll]] for (uint i = 0; i < o.length(); ++i) {
      if (fb_d[i] == -2.0) {
        run_o[i] = o[i];
      } else if (fb_d[i] >= 0.0) {
        precise float na = run_o[i] * fa_d[i] + o[i] * fb_d[i];
        run_o[i] = na;
      }
    }
  }
  if (split_launch) {
    if (c_lo > c_hi) {  // a split the tile does not reach: an empty state
      o = ROWS_DIMS(0.0);
      l = ROWS_KEYS(0.0);
      coopMatPerElementNV(o, o, store_partial_o, row0, q_len, q_start, kh, gl_WorkGroupID.z);
      coopMatPerElementNV(l, l, store_partial_ml, l, row0, q_len, q_start, kh, gl_WorkGroupID.z);
    }
    return;
  }
  ROWS_DIMS l_d;
  coopMatReduceNV(l_d, run_l, gl_CooperativeMatrixReduceRowNV, smear);
  coopMatPerElementNV(run_o, run_o, store_out, l_d, row0, q_len, q_start, kh);
}
