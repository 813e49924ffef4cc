// The body of paged_attention_varlen on tensor cores (f16 inputs, f32 accumulation), compiled in
// two spellings (common/coopmat_types.glsl): attention/paged_attention_varlen_coopmat.comp
// (GL_NV_cooperative_matrix) and coopmat2/paged_attention_varlen_khr.comp (GL_KHR_cooperative_matrix
// with cooperative matrix 2's conversions; the default where the device and compiler have them).
// Same rows, tiles, grid, splits, partial layout and merge pass as the scalar kernel; a different
// arithmetic, so its own bits — and its own parity contract: a row's result depends only on its
// own tokens, never on what shares its tile or launch, nor on whether one workgroup walked its
// splits or each split had one (the in-kernel merge is the merge pass's step, element for element).
//
// A subgroup owns 16 query rows of one query head (subgroup = row block * GQA + head); a
// workgroup holds RB row blocks of every query head of one KV head, so K and V pass through
// shared memory once for all of them. Per CT-key chunk: S = Q K^T on tensor cores; the online
// softmax in registers, on the fragments themselves (the device's fragment layout is the one
// common/mma_fragment.glsl describes; the engine checks at start-up): row maxima reduced over
// the quad of lanes that holds a row, weights converted to f16 fragments in place, their sums
// over the quad too; the running output rescaled per row; O += P V on tensor cores. Splits of
// SPLIT keys start from an empty state and are merged in split order.
// Without the scores' round trip through shared memory, 64-key chunks fit in 48 KiB (head_dim
// up to 128) and the scores of 4 key tiles accumulate independently. H100, 16k tokens, bf16: the
// round trip with 32-key chunks ran at 60 TFLOP/s, this structure's first version at 74, with the
// later steps (no look-ahead, 16-byte stores, unmasked whole chunks, RAW_SCORES) at 107; the KHR
// spelling 140, row sums by shuffles 144; with the context staged as f16 (attention/
// kv_half_staging.comp) 174, q staged at once 184, 8-byte output stores 189. A workgroup fills an
// SM (255 registers a thread), so its start and end are time the SM does nothing else. Tried and
// slower on the H100 at head_dim 128: the next chunk's loads in flight during compute (registers
// spill: 128 against 144; at head_dim 64 with 512 invocations they are one 16-byte load of K and
// one of V per invocation, and LOOKAHEAD gains 3-7 %), two 32-key buffers with one
// barrier per chunk (118), the running output merged in the output buffer instead of registers
// (no spills, 127), one row block per workgroup (two workgroups per SM, K/V read twice as often).
//
// f16 inputs: q, K and V are clamped to f16's range (+-65504) and converted with the device's
// rounding (bf16 converts exactly inside f16's normal range; f16 caches are taken as they are).
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_KHR_shader_subgroup_vote : require
#include "common/bda.glsl"
#include "common/dtype.glsl"
#include "common/attention_params.glsl"
#include "common/attention_merge.glsl"
#include "common/mma_fragment.glsl"
#include "common/coopmat_types.glsl"
#include "common/half_pack.glsl"

layout(constant_id = 0) const uint WG = 128;  // 32 * RB * GQA
layout(constant_id = 1) const uint HEAD_DIM = 128;
layout(constant_id = 2) const uint BLOCK_SIZE = 16;
layout(constant_id = 3) const uint GQA = 4;
layout(constant_id = 4) const uint RB = 1;
layout(constant_id = 5) const uint DTYPE = DT_BF16;
layout(constant_id = 6) const uint SPLIT = 256;  // a multiple of CT
layout(constant_id = 7) const uint CT = 64;      // keys per chunk: 64, or 32 where 64 do not fit
layout(constant_id = 8) const uint RAW_SCORES = 0;  // 1: no softcap and scale > 0 (see score())
// 1: the cache is a staging copy (engine/attention/kv_half_staging.h) whose block j of sequence s
// is block s * max_blocks_per_seq + j, so a chunk's loads need no block table read before them.
layout(constant_id = 9) const uint IDENTITY_TABLE = 0;
// 1: the output rows as f16 (common/half_pack.glsl's rounding, the bits to_half gives from the f32
// rows) for a tensor-core projection that reads f16; split partials stay f32.
layout(constant_id = 10) const uint OUT_HALF = 0;
// 1: the next chunk's loads are issued before this chunk's products, so they arrive while the
// tensor cores work (a workgroup fills an SM: nothing else hides them). Only where they cost a
// thread few registers (NL = 1: head_dim 64 with 512 invocations).
layout(constant_id = 11) const uint LOOKAHEAD = 0;
// 1: each row's sum of weights as P times a ones tile on the tensor cores, not by the lanes (see
// the sums below). The launcher's choice by head_dim.
layout(constant_id = 12) const uint SUMS_ON_TENSOR_CORES = 0;
layout(local_size_x_id = 0) in;

const uint NSG = WG / 32;
const uint KS4 = HEAD_DIM / 8 + 1;  // k_s, v_s row stride in uvec4s (8 f16), padded off the banks' period
const uint DT = HEAD_DIM / 16;
const uint NT = CT / 16;            // 16-key tiles per chunk
const uint QT = 16 * RB;
const uint EPL = DTYPE == DT_F32 ? 4 : 8;
const uint VECS = HEAD_DIM / EPL;
const uint NL = (CT * VECS + WG - 1) / WG;

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

// A chunk's keys and values go from global memory to registers to k_s / v_s (as f16). Unless
// LOOKAHEAD, not before the chunk's turn: at head_dim 128 holding the next chunk in registers
// while this one computes (NL = 4 uvec4s each for K and V) pushed the kernel into spills, and
// measured slower on the H100 (16k tokens, bf16: 74-75 TFLOP/s against 77-78 without; loading it
// later in the chunk, 71-73). At NL = 1 it is 8 registers, and faster.
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
      const int slot = seq * int(pc.max_blocks_per_seq) + tok / int(BLOCK_SIZE);
      const int blk = IDENTITY_TABLE != 0 ? slot : I32Ref(pc.block_tables).v[slot];
      const uint64_t e = (uint64_t(blk) * BLOCK_SIZE + uint(tok) % BLOCK_SIZE) * row_stride + kh * HEAD_DIM +
                         (idx % VECS) * EPL;
      kw[n] = U32x4Ref(pc.k_cache + e * esize).v[0];
      vw[n] = U32x4Ref(pc.v_cache + e * esize).v[0];
    }
  }
}

// k_s / v_s rows hold f16 values packed 8 to a uvec4, so a thread stores a 16-byte load with one
// 16-byte store (bf16 converted pairwise, common/half_pack.glsl), not eight 2-byte ones.
void store_chunk(uint tid) {
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
}

// With RAW_SCORES a row's running maximum is over raw dot products (a positive scale keeps their
// order) and a weight is exp2(dot * k - max * k) with k = scale * log2(e): one FMA and the exp2
// per score instead of a scaling, a subtraction and exp's own scaling. In natural units the
// maximum is max * scale (the partials' and the merge's m).
float score(float dot) { return RAW_SCORES != 0 ? dot : attention_score(dot, pc.scale, pc.softcap); }
float weight(float x, float m, float mk, float k) { return RAW_SCORES != 0 ? exp2(fma(x, k, -mk)) : exp(x - m); }
float natural_max(float m) { return RAW_SCORES != 0 ? m * pc.scale : m; }

float quad_max(float x) {
  x = max(x, subgroupShuffleXor(x, 1));
  return max(x, subgroupShuffleXor(x, 2));
}

layout(buffer_reference, std430, buffer_reference_align = 8) buffer F32x2Ref { vec2 v[]; };

// Writes a subgroup's 16 x HEAD_DIM accumulator rows (f32), row of group g to dst[g] + d, divided
// by div[g] when normalize. A lane's elements e and e + 1 are adjacent columns: one 8-byte store
// (a split partial's row of HEAD_DIM + 2 floats is 8-byte aligned, not 16). A workgroup's last
// act is writing its rows, and one workgroup fills an SM: H100, 4096 tokens, 162 -> 169 TFLOP/s
// against 4-byte stores; 16-byte ones (each lane's pair joined with its neighbour's) gained nothing.
// With OUT_HALF, normalized rows go out as f16 pairs (dst[g] then addresses f16 rows).
void write_rows(ACC t[DT], uint lane, bool valid[2], uint64_t dst[2], bool normalize, float div[2]) {
  [[unroll]] for (uint j = 0; j < DT; ++j) {
    [[unroll]] for (uint e = 0; e < 8; e += 2) {
      const uint g = frag_group(e);
      const vec2 x = vec2(t[j][e], t[j][e + 1]);
      if (!valid[g]) continue;
      const uint col = j * 16 + frag_col(lane, e);
      if (normalize && OUT_HALF != 0) {
        const vec2 y = x / div[g];
        U32Ref(dst[g] + col * 2).v[0] = pack_half2(y.x, y.y);
      } else {
        F32x2Ref(dst[g] + col * 4).v[0] = normalize ? x / div[g] : x;
      }
    }
  }
}

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint sg = tid / 32;
  const uint lane = tid % 32;
  const uint rb = sg / GQA;
  const uint g_ = sg % GQA;
  const uint kh = gl_WorkGroupID.x;  // KV heads fastest: see the launcher
  const uint num_heads = pc.num_kv_heads * GQA;
  const uint h = kh * GQA + g_;
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

  // This lane's two rows (elements 0-3 and 4-7 of each fragment).
  int r[2], pos[2], lo[2];
  bool valid[2];
  uint64_t orow[2];
  [[unroll]] for (uint g = 0; g < 2; ++g) {
    r[g] = row0 + int(rb * 16 + frag_row(lane, 4 * g));
    valid[g] = r[g] < q_len;
    pos[g] = ctx - q_len + r[g];
    lo[g] = pc.window > 0 ? max(pos[g] - pc.window + 1, 0) : 0;
    orow[g] = uint64_t(q_start + r[g]) * num_heads + h;
  }

  // q as f16 fragments. Before the first chunk, k_s and v_s are free: each subgroup converts its
  // 16 rows there (clamped to f16's range) and loads them as A operands. Every lane's loads of a
  // round are in flight together; staging one 16 x 16 f32 tile at a time in a scratch of its own
  // waited on the loads DT times, while the rest of the SM waited on this workgroup (H100, bf16
  // staged, 4096 / 16384 tokens: 152 / 175 -> 162 / 184 TFLOP/s). Subgroups take turns where
  // their rows do not all fit (32-key chunks of head_dim 256).
  HALF qf[DT];
  {
    const uint QV = HEAD_DIM / 8;              // 8-value units per row
    const uint Q_PER_ARRAY = CT / 16;          // subgroups' rows per shared array
    const uint Q_TURN = 2 * Q_PER_ARRAY;       // subgroups staging at once
    const uint Q_UNITS = 16 * QV / 32;         // units per lane
    const uint Q_BATCH = Q_UNITS < 8 ? Q_UNITS : 8;
    const int qrow0 = row0 + int(rb * 16);
    for (uint turn = 0; turn < (NSG + Q_TURN - 1) / Q_TURN; ++turn) {
      const bool mine = sg / Q_TURN == turn;
      const uint slot = sg % Q_TURN;
      const uint base = (slot % Q_PER_ARRAY) * 16 * KS4;
      if (mine) {
        for (uint b0 = 0; b0 < Q_UNITS; b0 += Q_BATCH) {
          vec4 lo[Q_BATCH], hi[Q_BATCH];
          [[unroll]] for (uint b = 0; b < Q_BATCH; ++b) {
            const uint u = lane + (b0 + b) * 32, r = u / QV, c = u % QV;
            const int rq = qrow0 + int(r);
            lo[b] = vec4(0.0);
            hi[b] = vec4(0.0);
            if (rq < q_len) {
              const uint64_t at_ = ((uint64_t(q_start + rq) * num_heads + h) * HEAD_DIM + c * 8) * 4;
              lo[b] = uintBitsToFloat(U32x4Ref(pc.q + at_).v[0]);
              hi[b] = uintBitsToFloat(U32x4Ref(pc.q + at_ + 16).v[0]);
            }
          }
          [[unroll]] for (uint b = 0; b < Q_BATCH; ++b) {
            const uint u = lane + (b0 + b) * 32, r = u / QV, c = u % QV;
            const uvec4 packed = uvec4(pack_half2(lo[b].x, lo[b].y), pack_half2(lo[b].z, lo[b].w),
                                       pack_half2(hi[b].x, hi[b].y), pack_half2(hi[b].z, hi[b].w));
            if (slot < Q_PER_ARRAY) {
              k_s[base + r * KS4 + c] = packed;
            } else {
              v_s[base + r * KS4 + c] = packed;
            }
          }
        }
        subgroupMemoryBarrierShared();
        subgroupBarrier();
        [[unroll]] for (uint j = 0; j < DT; ++j) {
          if (slot < Q_PER_ARRAY) {
            LOAD(qf[j], k_s, base + j * 2, KS4, false);
          } else {
            LOAD(qf[j], v_s, base + j * 2, KS4, false);
          }
        }
      }
      barrier();  // the next turn, or the first chunk, writes where these rows were
    }
  }
  const float k2 = pc.scale * 1.4426950408889634;  // log2(e)

  ACC o[DT], run_o[DT];
  [[unroll]] for (uint j = 0; j < DT; ++j) run_o[j] = ACC(0.0);
  float m[2], run_m[2];
  precise float l[2];  // the split's sums of weights
  precise float run_l[2];
  [[unroll]] for (uint g = 0; g < 2; ++g) {
    run_m[g] = NEG_INF;
    run_l[g] = 0.0;
  }

  if (LOOKAHEAD != 0 && c_lo <= c_hi) fetch_chunk(c_lo, seq, ctx, kh, tid);
  for (int c = c_lo; c <= c_hi; ++c) {
    const int s = c * int(CT) / int(SPLIT);
    if (c == c_lo || c * int(CT) % int(SPLIT) == 0) {  // a split starts from an empty state
      [[unroll]] for (uint j = 0; j < DT; ++j) o[j] = ACC(0.0);
      l[0] = 0.0;
      l[1] = 0.0;
      m[0] = NEG_INF;
      m[1] = NEG_INF;
    }
    if (LOOKAHEAD == 0) fetch_chunk(c, seq, ctx, kh, tid);
    barrier();  // every subgroup is done with the previous chunk
    store_chunk(tid);
    barrier();
    if (LOOKAHEAD != 0 && c < c_hi) fetch_chunk(c + 1, seq, ctx, kh, tid);
    ACC sacc[NT];
    [[unroll]] for (uint n = 0; n < NT; ++n) sacc[n] = ACC(0.0);
    [[unroll]] for (uint j = 0; j < DT; ++j) {
      [[unroll]] for (uint n = 0; n < NT; ++n) {
        HALF_B kt;
        LOAD(kt, k_s, n * 16 * KS4 + j * 2, KS4, true);
        sacc[n] = MMA(qf[j], kt, sacc[n]);
      }
    }
    float mc[2] = {NEG_INF, NEG_INF};
    // A chunk every row of the subgroup sees whole needs no mask: most chunks of a long prompt
    // (measured on the H100, 16k tokens: 92-94 TFLOP/s bf16 against 84-85 masking every chunk).
    const bool whole = subgroupAll(valid[1] && c * int(CT) + int(CT) - 1 <= pos[0] && c * int(CT) >= lo[1]);
    if (whole) {
      [[unroll]] for (uint n = 0; n < NT; ++n) {
        [[unroll]] for (uint e = 0; e < 8; ++e) {
          const float x = score(sacc[n][e]);
          sacc[n][e] = x;
          mc[frag_group(e)] = max(mc[frag_group(e)], x);
        }
      }
    } else {
      [[unroll]] for (uint n = 0; n < NT; ++n) {
        [[unroll]] for (uint e = 0; e < 8; ++e) {
          const uint g = frag_group(e);
          const int tok = c * int(CT) + int(n * 16 + frag_col(lane, e));
          const float x = (!valid[g] || tok > pos[g] || tok < lo[g]) ? NEG_INF : score(sacc[n][e]);
          sacc[n][e] = x;
          mc[g] = max(mc[g], x);
        }
      }
    }
    float corr[2], mk[2];
    bool none[2];
    [[unroll]] for (uint g = 0; g < 2; ++g) {
      const float m_new = max(m[g], quad_max(mc[g]));
      none[g] = m_new == NEG_INF;
      mk[g] = m_new * k2;
      // A maximum that did not move rescales by exactly 1: exp2(fma(m, k2, -m k2)) is e^0 only up
      // to m k2's rounding, which would make a row's bits depend on chunks wholly masked for it —
      // those past its position that its tile's later rows reach, so on where its tile starts.
      corr[g] = none[g] || m_new == m[g] ? 1.0 : weight(m[g], m_new, mk[g], k2);
      m[g] = m_new;
    }
    HALF pm[NT];
    [[unroll]] for (uint n = 0; n < NT; ++n) {
      [[unroll]] for (uint e = 0; e < 8; ++e) {
        const uint g = frag_group(e);
        sacc[n][e] = none[g] ? 0.0 : weight(sacc[n][e], m[g], mk[g], k2);
      }
      pm[n] = HALF(sacc[n]);
    }
    // Each row's sum of the f16 weights (what P V multiplies), in one of two fixed orders (each its
    // own bits, chosen by shape alone). By the lanes: each lane's in a fixed order, then over its
    // quad, so the row's four lanes agree; two instructions an element (an f16 to f32 conversion
    // and an add). On the tensor cores: P times a ones tile, an MMA per key tile (an eighth more
    // tensor work at head_dim 64), every column of the product the row's sum from the same
    // operands, so the same bits in every lane (a split's partial keeps lane 0's, a walked row
    // each lane's own: the split-or-walked tests would see a difference). At head_dim 128 the lanes
    // won (H100, 16k tokens, bf16: 144 against 140 TFLOP/s); at 64 a chunk's tensor work halves
    // while the lanes' two instructions a weight stay, and the tensor cores win (H200, bf16 staged,
    // 8 / 2 and 32 / 8 heads at 32768 tokens: 185.5 -> 188.1 and 186.6-186.9 -> 189.5 TFLOP/s).
    if (SUMS_ON_TENSOR_CORES != 0) {
      ACC sums = ACC(0.0);
      const HALF_B ones = HALF_B(float16_t(1.0));
      [[unroll]] for (uint n = 0; n < NT; ++n) sums = MMA(pm[n], ones, sums);
      [[unroll]] for (uint g = 0; g < 2; ++g) {
        precise float nl = l[g] * corr[g] + sums[4 * g];
        l[g] = nl;
      }
    } else {
      float part[2] = {0.0, 0.0};
      [[unroll]] for (uint n = 0; n < NT; ++n) {
        [[unroll]] for (uint e = 0; e < 8; ++e) {
          precise float x = part[frag_group(e)] + float(pm[n][e]);
          part[frag_group(e)] = x;
        }
      }
      [[unroll]] for (uint g = 0; g < 2; ++g) {
        precise float a = part[g] + subgroupShuffleXor(part[g], 1);
        precise float b = a + subgroupShuffleXor(a, 2);
        precise float nl = l[g] * corr[g] + b;
        l[g] = nl;
      }
    }
    // Rescale the running output where a row's maximum moved (x * 1 is x: skipping is exact).
    if (!subgroupAll(corr[0] == 1.0 && corr[1] == 1.0)) {
      [[unroll]] for (uint j = 0; j < DT; ++j) {
        [[unroll]] for (uint e = 0; e < 8; ++e) {
          precise float x = o[j][e] * corr[frag_group(e)];
          o[j][e] = x;
        }
      }
    }
    [[unroll]] for (uint n = 0; n < NT; ++n) {
      [[unroll]] for (uint j = 0; j < DT; ++j) {
        HALF_B vt;
        LOAD(vt, v_s, n * 16 * KS4 + j * 2, KS4, false);
        o[j] = MMA(pm[n], vt, o[j]);
      }
    }
    if (c < c_hi && (c + 1) * int(CT) % int(SPLIT) != 0) continue;
    // The split ends here.
    if (split_launch) {
      uint64_t dst[2];
      [[unroll]] for (uint g = 0; g < 2; ++g) {
        const uint64_t at_ = (orow[g] * pc.max_splits + uint(s)) * (HEAD_DIM + 2);
        dst[g] = pc.partial + at_ * 4;
        if (valid[g] && (lane & 3) == 0) {
          F32Ref(pc.partial + (at_ + HEAD_DIM) * 4).v[0] = natural_max(m[g]);
          F32Ref(pc.partial + (at_ + HEAD_DIM + 1) * 4).v[0] = l[g];
        }
      }
      float one[2] = {1.0, 1.0};
      write_rows(o, lane, valid, dst, false, one);
      continue;
    }
    // Merge into the running state (the merge pass's arithmetic): skip a split the row does not
    // reach, take the first one as it is, merge the others.
    float fa[2], fb[2], mode[2];
    [[unroll]] for (uint g = 0; g < 2; ++g) {
      mode[g] = 0.0;
      fa[g] = 0.0;
      fb[g] = 0.0;
      if (l[g] > 0.0) {
        if (run_l[g] == 0.0) {
          mode[g] = 1.0;
          run_m[g] = natural_max(m[g]);
          run_l[g] = l[g];
        } else {
          mode[g] = 2.0;
          float mm;
          merge_factors(run_m[g], natural_max(m[g]), mm, fa[g], fb[g]);
          precise float nl = run_l[g] * fa[g] + l[g] * fb[g];
          run_l[g] = nl;
          run_m[g] = mm;
        }
      }
    }
    [[unroll]] for (uint j = 0; j < DT; ++j) {
      [[unroll]] for (uint e = 0; e < 8; ++e) {
        const uint g = frag_group(e);
        if (mode[g] == 1.0) {
          run_o[j][e] = o[j][e];
        } else if (mode[g] == 2.0) {
          precise float na = run_o[j][e] * fa[g] + o[j][e] * fb[g];
          run_o[j][e] = na;
        }
      }
    }
  }
  uint64_t dst[2];
  if (split_launch) {
    if (c_lo > c_hi) {  // a split the tile does not reach: an empty state
      [[unroll]] for (uint g = 0; g < 2; ++g) {
        const uint64_t at_ = (orow[g] * pc.max_splits + gl_WorkGroupID.z) * (HEAD_DIM + 2);
        dst[g] = pc.partial + at_ * 4;
        if (valid[g] && (lane & 3) == 0) {
          F32Ref(pc.partial + (at_ + HEAD_DIM) * 4).v[0] = NEG_INF;
          F32Ref(pc.partial + (at_ + HEAD_DIM + 1) * 4).v[0] = 0.0;
        }
      }
      [[unroll]] for (uint j = 0; j < DT; ++j) o[j] = ACC(0.0);
      float one[2] = {1.0, 1.0};
      write_rows(o, lane, valid, dst, false, one);
    }
    return;
  }
  float div[2];
  [[unroll]] for (uint g = 0; g < 2; ++g) {
    dst[g] = pc.out_ + orow[g] * HEAD_DIM * (OUT_HALF != 0 ? 2 : 4);
    div[g] = run_l[g];
  }
  write_rows(run_o, lane, valid, dst, true, div);
}
