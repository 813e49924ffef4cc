#version 460
// paged_attention_decode: one query token per sequence against its paged K/V, GQA (GQA query
// heads share a KV head), per-sequence lengths, optional sliding window and soft-capping.
// Grid (split, kv head, sequence): a split covers SPLIT consecutive context tokens, so long
// contexts spread over many workgroups. Splits vary fastest, so a row's splits run together and
// its merge overlaps the splits of rows dispatched after it instead of piling up at the end. A
// sequence of one split writes its output directly; with more, each split writes an unnormalized
// partial result plus (max, sum) and takes a ticket for its (sequence, kv head); the workgroup
// that takes the last ticket merges the partials of every GQA head, reading them in split order
// (so the result does not depend on which one finished last), and resets the ticket for the next
// launch; rows of more than TWO_LEVEL splits merge groups of GROUP splits first, then the groups
// (merge_if_last). One launch, no second kernel. SPLIT is fixed per shape, never chosen from the batch, so
// a sequence decodes to the same bits alone or batched.
//
// Buffers: q, out f32 [num_seqs, num_heads, HEAD_DIM]; k_cache, v_cache [num_blocks, BLOCK_SIZE,
// num_kv_heads, HEAD_DIM] in DTYPE; block_tables i32 [num_seqs, max_blocks_per_seq]; seq_lens i32
// [num_seqs]; part_out f32 [num_seqs, num_heads, max_splits, HEAD_DIM]; part_ml f32 [..., 2];
// tickets u32: [num_seqs, num_kv_heads] for the rows, then [num_seqs, num_kv_heads, groups of
// the longest row] for two-level merges; zero between launches.
//
// Bandwidth is the goal (every K/V byte is read once): a row (one token, one KV head) is read by
// LANES lanes of one subgroup, 16 bytes each, and every lane keeps U rows' loads in flight. The U
// rows' dot products for all GQA heads are summed across the LANES lanes by a transposed
// reduce-scatter (log2(LANES) rounds of shuffles for all U*GQA values together, not each one).
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_EXT_control_flow_attributes : require
#include "common/bda.glsl"
#include "common/dtype.glsl"
#include "common/attention_params.glsl"

layout(constant_id = 0) const uint WG = 128;
layout(constant_id = 1) const uint HEAD_DIM = 128;
layout(constant_id = 2) const uint BLOCK_SIZE = 16;
layout(constant_id = 3) const uint GQA = 4;
layout(constant_id = 4) const uint LANES = 16;
layout(constant_id = 5) const uint SPLIT = 256;
layout(constant_id = 6) const uint DTYPE = DT_BF16;
layout(constant_id = 7) const uint NV = 16;  // U * GQA rounded up to a power of two
layout(constant_id = 8) const uint SUBGROUPS = 4;  // WG / subgroup size
layout(constant_id = 9) const uint RS_STEPS = 4;   // reduce-scatter rounds (host computes them)
layout(constant_id = 10) const uint BF_STEPS = 0;  // butterfly rounds after it
layout(constant_id = 11) const uint U = 4;         // rows per lane per step (loads in flight)
layout(constant_id = 12) const uint GROUP = 16;     // splits per group of a two-level merge
layout(constant_id = 13) const uint TWO_LEVEL = 64; // rows of more splits merge in two levels

layout(local_size_x_id = 0) in;

// Partials and tickets cross workgroups: coherent, so they bypass caches other SMs cannot see.
layout(buffer_reference, std430, buffer_reference_align = 4) coherent buffer SharedF32Ref { float v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) coherent buffer SharedU32Ref { uint v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) coherent buffer SharedF32x4Ref { vec4 v[]; };

const uint ESZ = DTYPE == DT_F32 ? 4 : 2;
const uint ELEMS = 16 / ESZ;                  // values per 16-byte load
const uint VEC_PER_ROW = HEAD_DIM / ELEMS;
const uint VEC_PER_LANE = VEC_PER_ROW / LANES;
const uint ROWS = WG / LANES;                 // rows read at once (times U per step)
const uint DUP = NV < LANES ? LANES / NV : 1; // lanes left holding the same reduced value

layout(push_constant) uniform Params {
  uint64_t q;
  uint64_t out_;
  uint64_t k_cache;
  uint64_t v_cache;
  uint64_t block_tables;
  uint64_t seq_lens;
  uint64_t part_out;
  uint64_t part_ml;
  uint64_t tickets;
  uint num_kv_heads;
  uint max_blocks_per_seq;
  uint max_splits;
  float scale;
  float softcap;  // 0: off
  int window;     // 0: off; else attend to the last `window` positions
} pc;

// The scores (GQA x SPLIT), then space for the rows' sums; the sums use the scores' space too.
shared float s_work[GQA * SPLIT + ROWS * HEAD_DIM];
shared float s_stat[2 * SUBGROUPS * GQA];  // maxima, then sums
shared bool s_last;
// Byte offsets of the split's cache blocks, read from the block table once per workgroup (the K
// and V passes would otherwise load a table entry per row and wait on it before every row load).
const uint SPLIT_BLOCKS = (SPLIT + BLOCK_SIZE - 2) / BLOCK_SIZE + 1;  // a split may straddle blocks
shared uint64_t s_block[SPLIT_BLOCKS];

// The address of this lane's first 16 bytes of token t's row (t in the split starting at start).
uint64_t row_address(uint64_t cache, uint start, uint kh, uint lane, uint t) {
  return cache + s_block[t / BLOCK_SIZE - start / BLOCK_SIZE] +
         ((t % BLOCK_SIZE) * pc.num_kv_heads + kh) * (HEAD_DIM * ESZ) + lane * 16;
}

// The U rows of one step (rows past end read as zeros).
void load_rows(uint64_t cache, uint start, uint end, uint kh, uint lane, uint row, uint step,
               out uvec4 w[U][VEC_PER_LANE]) {
  [[unroll]] for (uint u = 0; u < U; ++u) {
    const uint t = step + u * ROWS + row;
    if (t < end) {
      const uint64_t addr = row_address(cache, start, kh, lane, t);
      [[unroll]] for (uint v = 0; v < VEC_PER_LANE; ++v) w[u][v] = U32x4Ref(addr + uint64_t(v * LANES) * 16).v[0];
    } else {
      [[unroll]] for (uint v = 0; v < VEC_PER_LANE; ++v) w[u][v] = uvec4(0);
    }
  }
}

// Takes a ticket at `at` (this workgroup's writes released first); true in every thread of the
// workgroup that takes the last of `count`, which then sees every other one's writes and resets
// the ticket for the next launch. Called in uniform control flow.
bool last_ticket(uint64_t at, uint count) {
  memoryBarrierBuffer();  // release: this workgroup's partials before its ticket
  barrier();
  if (gl_LocalInvocationID.x == 0) {
    const bool last = atomicAdd(SharedU32Ref(at).v[0], 1u) == count - 1;
    if (last) SharedU32Ref(at).v[0] = 0;
    s_last = last;
  }
  barrier();
  const bool last = s_last;  // rewritten only after the next ticket's first barrier
  if (last) memoryBarrierBuffer();  // acquire: every other workgroup's partials after the last ticket
  return last;
}

// Combines the partial states first, first + stride, ... (count of them) of every GQA head of
// (seq, kh), in that order: o = sum_i exp(m_i - M) * o_i, l = sum_i exp(m_i - M) * l_i, M = max_i m_i
// (masked states carry m = -inf and weigh nothing). Writes o / l to the output, or with `keep`
// the state (M, l, o) into slot `first`. Called in uniform control flow.
void merge_range(uint seq, uint kh, uint first, uint count, uint stride, bool keep) {
  const uint tid = gl_LocalInvocationID.x;
  // The states' statistics are read by all threads at once (one load each, not a chain of
  // dependent loads per thread: that made the merge cost more than the second launch it saves),
  // the weights kept in shared memory (the scores' space is free by now). Every sum has a fixed order —
  // state j to thread j % WG in increasing j, then the subgroup and subgroup-order reductions —
  // so the bits depend on the row alone, never on which workgroup finished last.
  const uint num_heads = pc.num_kv_heads * GQA;
  const uint sg = gl_SubgroupID;
  const bool weights_fit = count <= SPLIT;  // one weight per (head, state) in the scores' space
  // Statistics of every head at once (all heads' loads in flight together; two rounds of loads,
  // not two per head).
  float big_m[GQA], big_l[GQA];
  float m_loc[GQA];
  [[unroll]] for (uint g = 0; g < GQA; ++g) m_loc[g] = NEG_INF;
  for (uint j = tid; j < count; j += WG) {
    [[unroll]] for (uint g = 0; g < GQA; ++g) {
      const uint64_t row = uint64_t(seq * num_heads + kh * GQA + g) * pc.max_splits;
      m_loc[g] = max(m_loc[g], SharedF32Ref(pc.part_ml + (row + first + j * stride) * 8).v[0]);
    }
  }
  [[unroll]] for (uint g = 0; g < GQA; ++g) {
    const float m = subgroupMax(m_loc[g]);
    if (subgroupElect()) s_stat[sg * GQA + g] = m;
  }
  barrier();
  [[unroll]] for (uint g = 0; g < GQA; ++g) {
    big_m[g] = NEG_INF;
    for (uint s = 0; s < SUBGROUPS; ++s) big_m[g] = max(big_m[g], s_stat[s * GQA + g]);
  }
  barrier();
  float l_loc[GQA];
  [[unroll]] for (uint g = 0; g < GQA; ++g) l_loc[g] = 0.0;
  for (uint j = tid; j < count; j += WG) {
    [[unroll]] for (uint g = 0; g < GQA; ++g) {
      const uint64_t at_ = (uint64_t(seq * num_heads + kh * GQA + g) * pc.max_splits + first + j * stride) * 8;
      const vec2 mli = vec2(SharedF32Ref(pc.part_ml + at_).v[0], SharedF32Ref(pc.part_ml + at_).v[1]);
      const float w = mli.x == NEG_INF ? 0.0 : exp(mli.x - big_m[g]);  // masked states weigh nothing
      if (weights_fit) s_work[g * SPLIT + j] = w;
      l_loc[g] += w * mli.y;
    }
  }
  [[unroll]] for (uint g = 0; g < GQA; ++g) {
    const float l = subgroupAdd(l_loc[g]);
    if (subgroupElect()) s_stat[sg * GQA + g] = l;
  }
  barrier();
  [[unroll]] for (uint g = 0; g < GQA; ++g) {
    big_l[g] = 0.0;
    for (uint s = 0; s < SUBGROUPS; ++s) big_l[g] += s_stat[s * GQA + g];
  }
  // Outputs: each thread four dimensions of one head, the states' partials loaded as vec4s
  // MERGE_AHEAD at a time, summed in state order. (One float per load for every head issued 4x the
  // coherent loads: on the H100 a 1 x 32k call took 119-124 us with them, 106-115 with vec4s, and
  // 85 with no merge at all, host-timed.)
  // Masked splits wrote zeros, so every partial is finite and a weight of 0 adds exactly 0.
  // H100, 1 x 32k with one-level merges, GPU-timed: 8, 12 and 16 ahead ran the same (80-82 us), as
  // did non-coherent loads; 24 took the kernel to 128 registers.
  const uint MERGE_AHEAD = 8;
  const uint VEC = HEAD_DIM / 4;
  for (uint idx = tid; idx < GQA * VEC; idx += WG) {
    const uint g = idx / VEC;
    const uint d = (idx % VEC) * 4;
    const uint64_t row = uint64_t(seq * num_heads + kh * GQA + g) * pc.max_splits;
    float m_g = NEG_INF, l_g = 0.0;
    [[unroll]] for (uint h = 0; h < GQA; ++h) {  // this head's statistics, without dynamic indexing
      if (h == g) {
        m_g = big_m[h];
        l_g = big_l[h];
      }
    }
    vec4 o = vec4(0.0);
    for (uint j0 = 0; j0 < count; j0 += MERGE_AHEAD) {
      vec4 x[MERGE_AHEAD];
      [[unroll]] for (uint k = 0; k < MERGE_AHEAD; ++k) {
        x[k] = j0 + k < count ? SharedF32x4Ref(pc.part_out + ((row + first + (j0 + k) * stride) * HEAD_DIM + d) * 4).v[0]
                              : vec4(0.0);
      }
      [[unroll]] for (uint k = 0; k < MERGE_AHEAD; ++k) {
        if (j0 + k < count) {
          float w;
          if (weights_fit) {
            w = s_work[g * SPLIT + j0 + k];
          } else {
            const float mi = SharedF32Ref(pc.part_ml + (row + first + (j0 + k) * stride) * 8).v[0];
            w = mi == NEG_INF ? 0.0 : exp(mi - m_g);
          }
          o += w * x[k];
        }
      }
    }
    if (keep) {  // slot `first`'s four values here are read by this thread alone, above
      SharedF32x4Ref(pc.part_out + ((row + first) * HEAD_DIM + d) * 4).v[0] = o;
    } else {
      const vec4 result = o / l_g;
      [[unroll]] for (uint c = 0; c < 4; ++c) {  // scalar stores: out need not be 16-byte aligned
        F32Ref(pc.out_ + (uint64_t(seq * num_heads + kh * GQA + g) * HEAD_DIM + d + c) * 4).v[0] = result[c];
      }
    }
  }
  if (!keep) return;
  barrier();  // the statistics of slot `first` are read before they are replaced
  if (tid == 0) {
    [[unroll]] for (uint g = 0; g < GQA; ++g) {
      const uint64_t at_ = (uint64_t(seq * num_heads + kh * GQA + g) * pc.max_splits + first) * 8;
      SharedF32Ref(pc.part_ml + at_).v[0] = big_m[g];
      SharedF32Ref(pc.part_ml + at_).v[1] = big_l[g];
    }
  }
}

// After this workgroup's partials (split sp of splits) are written: the merges it finishes. Rows
// of more than TWO_LEVEL splits merge in two levels: the workgroup that finishes a group of GROUP
// consecutive splits last merges the group (in split order) into the slot of its first split, and
// the one that finishes the last group merges the groups (in group order). One workgroup summing
// every split of a long row was the tail of a batch-1 call (H100, 1 x 32k: 15 of 80 us). The
// tree's shape depends on the row's split count alone, never on the batch.
void merge_if_last(uint seq, uint kh, uint sp, uint splits) {
  const uint64_t row_ticket = pc.tickets + uint64_t(seq * pc.num_kv_heads + kh) * 4;
  if (splits <= TWO_LEVEL) {
    if (last_ticket(row_ticket, splits)) merge_range(seq, kh, 0, splits, 1, false);
    return;
  }
  const uint groups = (splits + GROUP - 1) / GROUP;
  const uint grp = sp / GROUP;
  const uint max_groups = (pc.max_splits + GROUP - 1) / GROUP;
  const uint64_t group_ticket = pc.tickets + (uint64_t(pc.num_kv_heads) * gl_NumWorkGroups.z +
                                              uint64_t(seq * pc.num_kv_heads + kh) * max_groups + grp) * 4;
  if (!last_ticket(group_ticket, min(GROUP, splits - grp * GROUP))) return;
  merge_range(seq, kh, grp * GROUP, min(GROUP, splits - grp * GROUP), 1, true);
  if (last_ticket(row_ticket, groups)) merge_range(seq, kh, 0, groups, GROUP, false);
}

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint lane = tid % LANES;
  const uint row = tid / LANES;
  const uint sp = gl_WorkGroupID.x;
  const uint kh = gl_WorkGroupID.y;
  const uint seq = gl_WorkGroupID.z;
  const uint num_heads = pc.num_kv_heads * GQA;
  const uint len = uint(I32Ref(pc.seq_lens).v[seq]);
  const uint start = sp * SPLIT;
  if (start >= len) return;  // past the sequence: no split of it
  const uint splits = min((len + SPLIT - 1) / SPLIT, pc.max_splits);
  const int qpos = int(len) - 1;
  const int lo = pc.window > 0 ? max(qpos - pc.window + 1, 0) : 0;
  if (int(min(start + SPLIT, len)) <= lo) {
    // Nothing of this split is attended to: it weighs nothing in the merge (zeros, not garbage).
    [[unroll]] for (uint g = 0; g < GQA; ++g) {
      const uint64_t r = uint64_t(seq * num_heads + kh * GQA + g) * pc.max_splits + sp;
      for (uint d = tid; d < HEAD_DIM; d += WG) SharedF32Ref(pc.part_out + (r * HEAD_DIM + d) * 4).v[0] = 0.0;
      if (tid == 0) {
        SharedF32Ref(pc.part_ml + r * 8).v[0] = NEG_INF;
        SharedF32Ref(pc.part_ml + r * 8).v[1] = 0.0;
      }
    }
    merge_if_last(seq, kh, sp, splits);
    return;
  }
  const uint end = min(start + SPLIT, len);
  const uint n = end - start;
  const uint first_block = start / BLOCK_SIZE;
  for (uint i = tid; i < (end - 1) / BLOCK_SIZE - first_block + 1; i += WG) {
    const int blk = I32Ref(pc.block_tables).v[seq * pc.max_blocks_per_seq + first_block + i];
    s_block[i] = uint64_t(blk) * (BLOCK_SIZE * HEAD_DIM * ESZ) * pc.num_kv_heads;
  }

  // This lane's slice of every query head of this KV head.
  float qv[GQA][VEC_PER_LANE * 8];
  [[unroll]] for (uint g = 0; g < GQA; ++g) {
    const uint64_t qbase = uint64_t(seq * num_heads + kh * GQA + g) * HEAD_DIM;
    [[unroll]] for (uint v = 0; v < VEC_PER_LANE; ++v) {
      const uint d0 = (v * LANES + lane) * ELEMS;
      [[unroll]] for (uint e = 0; e < 8; ++e) {
        qv[g][v * 8 + e] = e < ELEMS ? F32Ref(pc.q + (qbase + d0 + e) * 4).v[0] : 0.0;
      }
    }
  }

  // Which reduced values this lane ends up holding after the reduce-scatter: indices
  // [base, base + HELD), each index being u * GQA + g. Every loop below has a trip count known
  // once the constants are specialized, and is unrolled: the arrays stay in registers.
  const uint HELD = NV >> RS_STEPS;
  uint base = 0;
  [[unroll]] for (uint s = 0; s < RS_STEPS; ++s) {
    if ((lane & (LANES >> (s + 1))) != 0) base += NV >> (s + 1);
  }

  barrier();  // s_block

  // 1. Scores. Every lane runs the same number of steps so the subgroup stays converged.
  for (uint step = start; step < end; step += ROWS * U) {
    uvec4 w[U][VEC_PER_LANE];
    load_rows(pc.k_cache, start, end, kh, lane, row, step, w);
    float acc[NV];
    [[unroll]] for (uint i = 0; i < NV; ++i) acc[i] = 0.0;
    [[unroll]] for (uint u = 0; u < U; ++u) {
      [[unroll]] for (uint v = 0; v < VEC_PER_LANE; ++v) {
        float e[8];
        unpack8(w[u][v], DTYPE, e);
        [[unroll]] for (uint g = 0; g < GQA; ++g) {
          [[unroll]] for (uint k = 0; k < ELEMS; ++k) acc[u * GQA + g] += qv[g][v * 8 + k] * e[k];
        }
      }
    }
    // Reduce-scatter across the LANES lanes of each row, then a plain butterfly if lanes remain.
    [[unroll]] for (uint s = 0; s < RS_STEPS; ++s) {
      const uint o = LANES >> (s + 1);
      const uint held = NV >> (s + 1);
      const bool upper = (lane & o) != 0;
      [[unroll]] for (uint i = 0; i < held; ++i) {
        const float send = upper ? acc[i] : acc[i + held];
        const float keep = upper ? acc[i + held] : acc[i];
        acc[i] = keep + subgroupShuffleXor(send, o);
      }
    }
    [[unroll]] for (uint s = 0; s < BF_STEPS; ++s) {
      acc[0] += subgroupShuffleXor(acc[0], LANES >> (RS_STEPS + s + 1));
    }
    if ((lane % DUP) == 0) {
      [[unroll]] for (uint j = 0; j < HELD; ++j) {
        const uint idx = base + j;
        const uint u = idx / GQA, g = idx % GQA;
        const uint t = step + u * ROWS + row;
        if (u < U && t < end) {
          s_work[g * SPLIT + (t - start)] =
              int(t) < lo ? NEG_INF : attention_score(acc[j], pc.scale, pc.softcap);
        }
      }
    }
  }
  barrier();

  // 2. Softmax statistics for every head at once: subgroup reductions, then across subgroups. A
  // thread keeps its scores between the maximum and the weights, and the sums go to their own
  // half of s_stat, so the two reductions take two barriers.
  const uint sg = gl_SubgroupID;
  const uint PER = (SPLIT + WG - 1) / WG;  // scores per thread and head
  float m_of[GQA], l_of[GQA];
  float sv[GQA][PER];
  [[unroll]] for (uint g = 0; g < GQA; ++g) {
    float m = NEG_INF;
    [[unroll]] for (uint k = 0; k < PER; ++k) {
      const uint i = tid + k * WG;
      sv[g][k] = i < n ? s_work[g * SPLIT + i] : NEG_INF;
      m = max(m, sv[g][k]);
    }
    m = subgroupMax(m);
    if (subgroupElect()) s_stat[sg * GQA + g] = m;
  }
  barrier();
  [[unroll]] for (uint g = 0; g < GQA; ++g) {
    float m = NEG_INF;
    for (uint s = 0; s < SUBGROUPS; ++s) m = max(m, s_stat[s * GQA + g]);
    m_of[g] = m;
    float l = 0.0;
    [[unroll]] for (uint k = 0; k < PER; ++k) {
      const uint i = tid + k * WG;
      if (i < n) {
        const float p = exp(sv[g][k] - m);
        s_work[g * SPLIT + i] = p;
        l += p;
      }
    }
    l = subgroupAdd(l);
    if (subgroupElect()) s_stat[(SUBGROUPS + sg) * GQA + g] = l;
  }
  barrier();
  [[unroll]] for (uint g = 0; g < GQA; ++g) {
    float l = 0.0;
    for (uint s = 0; s < SUBGROUPS; ++s) l += s_stat[(SUBGROUPS + s) * GQA + g];
    l_of[g] = l;
  }

  // 3. Weighted sum of V rows, U rows per lane in flight.
  float acc[GQA][VEC_PER_LANE * 8];
  [[unroll]] for (uint g = 0; g < GQA; ++g) {
    [[unroll]] for (uint k = 0; k < VEC_PER_LANE * 8; ++k) acc[g][k] = 0.0;
  }
  for (uint step = start; step < end; step += ROWS * U) {
    uvec4 w[U][VEC_PER_LANE];
    load_rows(pc.v_cache, start, end, kh, lane, row, step, w);
    [[unroll]] for (uint u = 0; u < U; ++u) {
      const uint t = step + u * ROWS + row;
      const bool valid = t < end;  // padded rows weigh 0 (their w is 0 and p is 0)
      [[unroll]] for (uint v = 0; v < VEC_PER_LANE; ++v) {
        float e[8];
        unpack8(w[u][v], DTYPE, e);
        [[unroll]] for (uint g = 0; g < GQA; ++g) {
          const float p = valid ? s_work[g * SPLIT + (t - start)] : 0.0;
          [[unroll]] for (uint k = 0; k < ELEMS; ++k) acc[g][v * 8 + k] += p * e[k];
        }
      }
    }
  }
  // 4. The rows' sums: the row groups of a subgroup added by shuffles, then the subgroups' sums
  // through shared memory (the scores' space too, free once every V row is weighed), as many heads
  // at a time as fit: all of them on 32-wide subgroups, so two barriers instead of two per head.
  [[unroll]] for (uint o = LANES; o < WG / SUBGROUPS; o *= 2) {
    [[unroll]] for (uint g = 0; g < GQA; ++g) {
      [[unroll]] for (uint k = 0; k < VEC_PER_LANE * 8; ++k) acc[g][k] += subgroupShuffleXor(acc[g][k], o);
    }
  }
  // At least one: a row's lanes share a subgroup, so ROWS >= SUBGROUPS.
  const uint HEADS_AT_ONCE = max(1u, min(GQA, (GQA * SPLIT + ROWS * HEAD_DIM) / (SUBGROUPS * HEAD_DIM)));
  barrier();  // every V row weighed: the scores' space is free
  for (uint g0 = 0; g0 < GQA; g0 += HEADS_AT_ONCE) {
    const uint heads = min(HEADS_AT_ONCE, GQA - g0);
    if (gl_SubgroupInvocationID < LANES) {
      [[unroll]] for (uint g = 0; g < GQA; ++g) {
        if (g >= g0 && g < g0 + heads) {
          [[unroll]] for (uint v = 0; v < VEC_PER_LANE; ++v) {
            [[unroll]] for (uint k = 0; k < ELEMS; ++k) {
              s_work[((g - g0) * SUBGROUPS + sg) * HEAD_DIM + (v * LANES + lane) * ELEMS + k] = acc[g][v * 8 + k];
            }
          }
        }
      }
    }
    barrier();
    for (uint i = tid; i < heads * HEAD_DIM; i += WG) {
      const uint g = g0 + i / HEAD_DIM, d = i % HEAD_DIM;
      const uint h = kh * GQA + g;
      float o = 0.0;
      for (uint r = 0; r < SUBGROUPS; ++r) o += s_work[((g - g0) * SUBGROUPS + r) * HEAD_DIM + d];
      if (splits == 1) {
        float l_g = 0.0;
        [[unroll]] for (uint x = 0; x < GQA; ++x) {  // without dynamic indexing
          if (x == g) l_g = l_of[x];
        }
        F32Ref(pc.out_ + (uint64_t(seq * num_heads + h) * HEAD_DIM + d) * 4).v[0] = o / l_g;
      } else {
        SharedF32Ref(pc.part_out + ((uint64_t(seq * num_heads + h) * pc.max_splits + sp) * HEAD_DIM + d) * 4)
            .v[0] = o;
      }
    }
    barrier();
  }
  if (splits > 1 && tid == 0) {
    [[unroll]] for (uint g = 0; g < GQA; ++g) {
      const uint64_t i = (uint64_t(seq * num_heads + kh * GQA + g) * pc.max_splits + sp) * 2;
      SharedF32Ref(pc.part_ml + i * 4).v[0] = m_of[g];
      SharedF32Ref(pc.part_ml + i * 4).v[1] = l_of[g];
    }
  }
  if (splits > 1) merge_if_last(seq, kh, sp, splits);
}
