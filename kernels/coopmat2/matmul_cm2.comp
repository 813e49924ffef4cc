#version 460
// y[r, c] = (accumulate ? y[r, c] : 0) + sum_k x[r, k] * w[k, c] on NVIDIA's cooperative matrix 2,
// for the model's projections at the tensor cores' rate: x as f16 rows [rows, k] (written by the
// producers — rms_norm, attention, this kernel's GATED form; silu_mul or to_half where those
// cannot — clamped and rounded by common/half_pack.glsl's rule), w as
// f16 stored transposed [n, k] (both operands k-contiguous, the layout the tensor cores' loads
// take without shuffles), y f32 [rows, n].
//
// A workgroup computes one BM x BN tile as a workgroup-scope matrix and steps k BK at a time
// through tensor-layout loads: the driver stages the tiles through shared memory and overlaps the
// next step's loads with this step's products, which hand-written subgroup kernels under Vulkan's
// 48 KiB and without asynchronous copies did not (matmul_coopmat.glsl: 64 x 64 tiles). Tiles past
// the last row or column load zeros (clamped layouts) and store nothing there.
//
// No split-k: every output sums its k in order, one tensor-core step after another, from its own
// row of x and column of w, so a row's values do not depend on the rows beside it in the launch,
// nor on the tile shape (specialization constants; the launcher picks one by the launch's size).
// tests/engine/matmul_test.cc holds both properties (run on the H100 and the H200).
//
// GATED: SwiGLU's gate and up projections in one launch, silu(x w) * (x w_up) written as f16 rows
// for the down projection (the bits silu_mul.comp and common/half_pack.glsl give): a tile's BN
// columns are BN / 2 outputs of each, sharing x's loads, and the two [rows, n] f32 results never
// reach memory.
//
// Segments: y's columns [0, n1), [n1, n2) and [n2, n) go to three matrices, y, y2 and y3, of
// those widths — the attention's q, k and v projections as one launch over their weights side by
// side. The launcher picks a tile whose columns divide every width, so no tile straddles two.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_shader_16bit_storage : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_NV_cooperative_matrix2 : require
#include "common/bda.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint THREADS = 256;
layout(constant_id = 1) const uint BM = 128;  // rows per tile
layout(constant_id = 2) const uint BN = 256;  // columns per tile
layout(constant_id = 3) const uint BK = 64;   // k per step
layout(constant_id = 4) const uint UNROLL = 8;  // steps per loop iteration (the driver pipelines within one)
layout(constant_id = 5) const uint GATED = 0;
// Workgroups walk the output in groups of GROUP_M row tiles, column tile by column tile, instead
// of row tile by row tile: the SMs then work on a few rows of x against a band of w's columns at
// a time, so a weight tile reaches L2 once for GROUP_M row tiles rather than once for each (w is
// larger than L2 at the FFN's shapes). Which workgroup computes a tile changes no bit of it.
layout(constant_id = 6) const uint GROUP_M = 1;
const uint BN_OUT = BN / (1 + GATED);  // output columns per tile

layout(buffer_reference, std430, buffer_reference_align = 16) buffer HalfRows { float16_t v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) buffer FloatRows { float v[]; };

layout(push_constant) uniform Params {
  uint64_t x;  // f16 [rows, k]
  uint64_t w;  // f16 [n, k]: the weights transposed
  uint64_t y;  // f32 [rows, n]; GATED: f16 [rows, n]
  uint64_t w_up;  // GATED: the up projection's weights, f16 [n, k]
  uint64_t y2;    // columns [n1, n2), f32 [rows, n2 - n1]
  uint64_t y3;    // columns [n2, n), f32 [rows, n - n2]
  uint rows;
  uint k;
  uint n;
  uint accumulate;
  uint n1;  // n1 = n2 = n: y alone
  uint n2;
} pc;

#define ACC coopmat<float, gl_ScopeWorkgroup, BM, BN_OUT, gl_MatrixUseAccumulator>
#define TILE_A coopmat<float16_t, gl_ScopeWorkgroup, BM, BK, gl_MatrixUseA>
#define TILE_B coopmat<float16_t, gl_ScopeWorkgroup, BK, BN_OUT, gl_MatrixUseB>
#define CLAMPED gl_CooperativeMatrixClampModeConstantNV

// One k step: x's tile times w's (and w_up's) into the accumulators.
#define STEP(LA, LB, K0)                                                                   \
  {                                                                                        \
    TILE_A a;                                                                              \
    TILE_B b;                                                                              \
    coopMatLoadTensorNV(a, x.v, 0, sliceTensorLayoutNV(LA, row0, BM, K0, BK));             \
    coopMatLoadTensorNV(b, w.v, 0, sliceTensorLayoutNV(LB, col0, BN_OUT, K0, BK), transposed); \
    acc = coopMatMulAdd(a, b, acc);                                                        \
    if (GATED != 0) {                                                                      \
      coopMatLoadTensorNV(b, w_up.v, 0, sliceTensorLayoutNV(LB, col0, BN_OUT, K0, BK), transposed); \
      acc_up = coopMatMulAdd(a, b, acc_up);                                                \
    }                                                                                      \
  }

// Every k step in order: UNROLL per loop iteration (the driver pipelines the loads within one),
// then the steps left over; the products are summed in the same order either way.
#define WALK_K(LA, LB)                                                        \
  {                                                                           \
    uint k0 = 0;                                                              \
    for (; k0 + UNROLL * BK <= pc.k; k0 += UNROLL * BK) {                     \
      [[unroll]] for (uint u = 0; u < UNROLL; ++u) STEP(LA, LB, k0 + u * BK)  \
    }                                                                         \
    for (; k0 < pc.k; k0 += BK) STEP(LA, LB, k0)                              \
  }

const float F16_MAX = 65504.0;
// silu_mul.comp's arithmetic, clamped to f16's range as common/half_pack.glsl clamps.
float silu_times(const in uint r, const in uint c, const in float g, const in float u) {
  return clamp(g / (1.0 + exp(-g)) * u, -F16_MAX, F16_MAX);
}

void main() {
  uint tile_x = gl_WorkGroupID.x, tile_y = gl_WorkGroupID.y;
  if (GROUP_M > 1) {
    const uint nx = gl_NumWorkGroups.x, ny = gl_NumWorkGroups.y;
    const uint id = gl_WorkGroupID.y * nx + gl_WorkGroupID.x;
    const uint band = id / (GROUP_M * nx), in_band = id % (GROUP_M * nx);
    const uint rows_in_band = min(ny - band * GROUP_M, GROUP_M);
    tile_y = band * GROUP_M + in_band % rows_in_band;
    tile_x = in_band / rows_in_band;
  }
  const uint row0 = tile_y * BM;
  const uint col0 = tile_x * BN_OUT;
  HalfRows x = HalfRows(pc.x);
  HalfRows w = HalfRows(pc.w);
  HalfRows w_up = HalfRows(pc.w_up);
  const tensorViewNV<2, false, 1, 0> transposed = createTensorViewNV(2, false, 1, 0);
  ACC acc = ACC(0.0);
  ACC acc_up = ACC(0.0);
  // Row strides with their low bits cleared (the launcher guarantees k % 8 == 0, every output width % 4 == 0 and, GATED, n % 8 == 0):
  // the driver then knows every row starts 16-byte aligned and loads whole vectors; with the
  // strides as they came (the dimensions' defaults) it could not, and the same kernel ran at a
  // fifth of the rate (H200: 45 against 208-245 TFLOP/s at the 1B projections).
  const uint k_stride = pc.k & ~7u;
  if (row0 + BM <= pc.rows && col0 + BN_OUT <= pc.n && pc.k % BK == 0) {
    // The common tile: wholly inside, no clamping to check.
    tensorLayoutNV<2> la = setTensorLayoutDimensionNV(createTensorLayoutNV(2), pc.rows, pc.k);
    tensorLayoutNV<2> lb = setTensorLayoutDimensionNV(createTensorLayoutNV(2), pc.n, pc.k);
    la = setTensorLayoutStrideNV(la, k_stride, 1);
    lb = setTensorLayoutStrideNV(lb, k_stride, 1);
    WALK_K(la, lb)
  } else {
    // A tile past the last row or column (a decode step's one row, a hit's 16-row suffix, a
    // launch's last row tile): clamped loads, walked as the common tile is. One step per loop
    // iteration waited on each step's loads: H200, 16 rows on 32 x 32 tiles (matmul_bench), the
    // tiny model's q/k/v 0.027 -> 0.008 ms, the 1B's down projection 0.078 -> 0.057.
    tensorLayoutNV<2, CLAMPED> la = setTensorLayoutDimensionNV(createTensorLayoutNV(2, CLAMPED), pc.rows, pc.k);
    tensorLayoutNV<2, CLAMPED> lb = setTensorLayoutDimensionNV(createTensorLayoutNV(2, CLAMPED), pc.n, pc.k);
    la = setTensorLayoutStrideNV(la, k_stride, 1);
    lb = setTensorLayoutStrideNV(lb, k_stride, 1);
    WALK_K(la, lb)
  }
  if (GATED != 0) {
    tensorLayoutNV<2, CLAMPED> ly = setTensorLayoutDimensionNV(createTensorLayoutNV(2, CLAMPED), pc.rows, pc.n);
    ly = setTensorLayoutStrideNV(ly, pc.n & ~7u, 1);
    coopMatPerElementNV(acc, acc, silu_times, acc_up);
    const coopmat<float16_t, gl_ScopeWorkgroup, BM, BN_OUT, gl_MatrixUseAccumulator> h =
        coopmat<float16_t, gl_ScopeWorkgroup, BM, BN_OUT, gl_MatrixUseAccumulator>(acc);
    coopMatStoreTensorNV(h, HalfRows(pc.y).v, 0, sliceTensorLayoutNV(ly, row0, BM, col0, BN_OUT));
    return;
  }
  uint64_t dst = pc.y;
  uint first = 0, width = pc.n1;
  if (col0 >= pc.n2) {
    dst = pc.y3;
    first = pc.n2;
    width = pc.n - pc.n2;
  } else if (col0 >= pc.n1) {
    dst = pc.y2;
    first = pc.n1;
    width = pc.n2 - pc.n1;
  }
  FloatRows y = FloatRows(dst);
  tensorLayoutNV<2, CLAMPED> ly = setTensorLayoutDimensionNV(createTensorLayoutNV(2, CLAMPED), pc.rows, width);
  ly = setTensorLayoutStrideNV(ly, width & ~3u, 1);
  if (pc.accumulate != 0) {
    // One f32 add per element, y's old value first: the bits matmul_coopmat.glsl's epilogue gives.
    ACC old;
    coopMatLoadTensorNV(old, y.v, 0, sliceTensorLayoutNV(ly, row0, BM, col0 - first, BN_OUT));
    acc = old + acc;
  }
  coopMatStoreTensorNV(acc, y.v, 0, sliceTensorLayoutNV(ly, row0, BM, col0 - first, BN_OUT));
}
