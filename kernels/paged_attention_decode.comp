#version 460
// paged_attention_decode: one query token per sequence against its paged K/V, GQA (GQA query
// heads share a KV head), per-sequence lengths, optional sliding window and soft-capping.
// Grid (sequence, kv head, split): a split covers SPLIT consecutive context tokens, so long
// contexts spread over many workgroups; with more than one split each writes an unnormalized
// partial result plus (max, sum) and paged_attention_reduce combines them. Split boundaries depend
// only on the sequence length, never on the batch, so a sequence decodes the same alone or batched.
//
// Buffers: q, out f32 [num_seqs, num_heads, HEAD_DIM]; k_cache, v_cache [num_blocks, BLOCK_SIZE,
// num_kv_heads, HEAD_DIM] in DTYPE; block_tables i32 [num_seqs, max_blocks_per_seq]; seq_lens i32
// [num_seqs]; part_out f32 [num_seqs, num_heads, max_splits, HEAD_DIM]; part_ml f32 [..., 2].
//
// Each K/V row (one token, one KV head) is read once, 16 bytes per lane, by LANES lanes of one
// subgroup (LANES <= subgroup size; the butterfly reduction uses subgroupShuffleXor).
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_shuffle : require
#include "common/bda.glsl"
#include "common/dtype.glsl"
#include "common/attention_params.glsl"

layout(constant_id = 0) const uint WG = 128;
layout(constant_id = 1) const uint HEAD_DIM = 128;
layout(constant_id = 2) const uint BLOCK_SIZE = 16;
layout(constant_id = 3) const uint GQA = 4;
layout(constant_id = 4) const uint LANES = 16;
layout(constant_id = 5) const uint SPLIT = 512;
layout(constant_id = 6) const uint DTYPE = DT_BF16;

layout(local_size_x_id = 0) in;

const uint ESZ = DTYPE == DT_F32 ? 4 : 2;
const uint ELEMS = 16 / ESZ;                  // values per 16-byte load
const uint VEC_PER_ROW = HEAD_DIM / ELEMS;
const uint VEC_PER_LANE = VEC_PER_ROW / LANES;
const uint ROWS = WG / LANES;                 // rows read at once

layout(push_constant) uniform Params {
  uint64_t q;
  uint64_t out_;
  uint64_t k_cache;
  uint64_t v_cache;
  uint64_t block_tables;
  uint64_t seq_lens;
  uint64_t part_out;
  uint64_t part_ml;
  uint num_kv_heads;
  uint max_blocks_per_seq;
  uint max_splits;
  float scale;
  float softcap;  // 0: off
  int window;     // 0: off; else attend to the last `window` positions
} pc;

shared float s_scores[GQA * SPLIT];
shared float s_red[ROWS * HEAD_DIM];

uint64_t row_address(uint64_t cache, uint seq, uint kh, uint t) {
  const int blk = I32Ref(pc.block_tables).v[seq * pc.max_blocks_per_seq + t / BLOCK_SIZE];
  const uint64_t token_row = uint64_t(blk) * BLOCK_SIZE + (t % BLOCK_SIZE);
  return cache + (token_row * pc.num_kv_heads + kh) * (HEAD_DIM * ESZ);
}

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint lane = tid % LANES;
  const uint row = tid / LANES;
  const uint seq = gl_WorkGroupID.x;
  const uint kh = gl_WorkGroupID.y;
  const uint sp = gl_WorkGroupID.z;
  const uint num_heads = pc.num_kv_heads * GQA;
  const uint len = uint(I32Ref(pc.seq_lens).v[seq]);
  const uint start = sp * SPLIT;
  const int qpos = int(len) - 1;
  const int lo = pc.window > 0 ? max(qpos - pc.window + 1, 0) : 0;
  if (start >= len || int(min(start + SPLIT, len)) <= lo) {
    // Nothing of this split is attended to.
    if (pc.max_splits > 1 && tid < GQA) {
      const uint64_t i = (uint64_t(seq * num_heads + kh * GQA + tid) * pc.max_splits + sp) * 2;
      F32Ref(pc.part_ml + i * 4).v[0] = NEG_INF;
      F32Ref(pc.part_ml + i * 4).v[1] = 0.0;
    }
    return;
  }
  const uint end = min(start + SPLIT, len);
  const uint n = end - start;

  // This lane's slice of every query head of this KV head.
  float qv[GQA][VEC_PER_LANE * 8];
  for (uint g = 0; g < GQA; ++g) {
    const uint64_t qbase = uint64_t(seq * num_heads + kh * GQA + g) * HEAD_DIM;
    for (uint v = 0; v < VEC_PER_LANE; ++v) {
      const uint d0 = (v * LANES + lane) * ELEMS;
      for (uint e = 0; e < 8; ++e) {
        qv[g][v * 8 + e] = e < ELEMS ? F32Ref(pc.q + (qbase + d0 + e) * 4).v[0] : 0.0;
      }
    }
  }

  // 1. Scores. The loop count is the same for every row so the subgroup stays converged.
  for (uint base = start; base < end; base += ROWS) {
    const uint t = base + row;
    const bool valid = t < end;
    float acc[GQA];
    for (uint g = 0; g < GQA; ++g) acc[g] = 0.0;
    if (valid) {
      const uint64_t addr = row_address(pc.k_cache, seq, kh, t);
      for (uint v = 0; v < VEC_PER_LANE; ++v) {
        float e[8];
        unpack8(U32x4Ref(addr + uint64_t(v * LANES + lane) * 16).v[0], DTYPE, e);
        for (uint g = 0; g < GQA; ++g) {
          for (uint k = 0; k < ELEMS; ++k) acc[g] += qv[g][v * 8 + k] * e[k];
        }
      }
    }
    for (uint o = LANES / 2; o > 0; o /= 2) {
      for (uint g = 0; g < GQA; ++g) acc[g] += subgroupShuffleXor(acc[g], o);
    }
    if (valid && lane == 0) {
      for (uint g = 0; g < GQA; ++g) {
        s_scores[g * SPLIT + (t - start)] =
            int(t) < lo ? NEG_INF : attention_score(acc[g], pc.scale, pc.softcap);
      }
    }
  }
  barrier();

  // 2. Softmax statistics per head: max, then exp and sum (tree reductions, fixed order).
  float m_of[GQA], l_of[GQA];
  for (uint g = 0; g < GQA; ++g) {
    float m = NEG_INF;
    for (uint i = tid; i < n; i += WG) m = max(m, s_scores[g * SPLIT + i]);
    s_red[tid] = m;
    barrier();
    for (uint stride = WG / 2; stride > 0; stride /= 2) {
      if (tid < stride) s_red[tid] = max(s_red[tid], s_red[tid + stride]);
      barrier();
    }
    m = s_red[0];
    barrier();
    float l = 0.0;
    for (uint i = tid; i < n; i += WG) {
      const float p = exp(s_scores[g * SPLIT + i] - m);
      s_scores[g * SPLIT + i] = p;
      l += p;
    }
    s_red[tid] = l;
    barrier();
    for (uint stride = WG / 2; stride > 0; stride /= 2) {
      if (tid < stride) s_red[tid] += s_red[tid + stride];
      barrier();
    }
    m_of[g] = m;
    l_of[g] = s_red[0];
    barrier();
  }

  // 3. Weighted sum of V rows.
  float acc[GQA][VEC_PER_LANE * 8];
  for (uint g = 0; g < GQA; ++g) {
    for (uint k = 0; k < VEC_PER_LANE * 8; ++k) acc[g][k] = 0.0;
  }
  for (uint base = start; base < end; base += ROWS) {
    const uint t = base + row;
    if (t >= end) continue;
    const uint64_t addr = row_address(pc.v_cache, seq, kh, t);
    for (uint v = 0; v < VEC_PER_LANE; ++v) {
      float e[8];
      unpack8(U32x4Ref(addr + uint64_t(v * LANES + lane) * 16).v[0], DTYPE, e);
      for (uint g = 0; g < GQA; ++g) {
        const float p = s_scores[g * SPLIT + (t - start)];
        for (uint k = 0; k < ELEMS; ++k) acc[g][v * 8 + k] += p * e[k];
      }
    }
  }
  for (uint g = 0; g < GQA; ++g) {
    for (uint v = 0; v < VEC_PER_LANE; ++v) {
      for (uint k = 0; k < ELEMS; ++k) {
        s_red[row * HEAD_DIM + (v * LANES + lane) * ELEMS + k] = acc[g][v * 8 + k];
      }
    }
    barrier();
    const uint h = kh * GQA + g;
    for (uint d = tid; d < HEAD_DIM; d += WG) {
      float o = 0.0;
      for (uint r = 0; r < ROWS; ++r) o += s_red[r * HEAD_DIM + d];
      if (pc.max_splits == 1) {
        F32Ref(pc.out_ + (uint64_t(seq * num_heads + h) * HEAD_DIM + d) * 4).v[0] = o / l_of[g];
      } else {
        F32Ref(pc.part_out + ((uint64_t(seq * num_heads + h) * pc.max_splits + sp) * HEAD_DIM + d) * 4)
            .v[0] = o;
      }
    }
    if (pc.max_splits > 1 && tid == 0) {
      const uint64_t i = (uint64_t(seq * num_heads + h) * pc.max_splits + sp) * 2;
      F32Ref(pc.part_ml + i * 4).v[0] = m_of[g];
      F32Ref(pc.part_ml + i * 4).v[1] = l_of[g];
    }
    barrier();
  }
}
