#version 460
// y[r, c] = (accumulate ? y[r, c] : 0) + sum_k x[r, k] * w[k, c] on NVIDIA's cooperative matrix 2,
// for the model's projections at the tensor cores' rate: x as f16 rows [rows, k] (written by the
// producers — rms_norm, silu_mul, to_half — clamped and rounded by common/half_pack.glsl), w as
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
// tests/engine/matmul_test.cc holds both properties on the H100.
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

layout(buffer_reference, std430, buffer_reference_align = 16) buffer HalfRows { float16_t v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) buffer FloatRows { float v[]; };

layout(push_constant) uniform Params {
  uint64_t x;  // f16 [rows, k]
  uint64_t w;  // f16 [n, k]: the weights transposed
  uint64_t y;  // f32 [rows, n]
  uint rows;
  uint k;
  uint n;
  uint accumulate;
} pc;

#define ACC coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator>
#define TILE_A coopmat<float16_t, gl_ScopeWorkgroup, BM, BK, gl_MatrixUseA>
#define TILE_B coopmat<float16_t, gl_ScopeWorkgroup, BK, BN, gl_MatrixUseB>
#define CLAMPED gl_CooperativeMatrixClampModeConstantNV

void main() {
  const uint row0 = gl_WorkGroupID.y * BM;
  const uint col0 = gl_WorkGroupID.x * BN;
  HalfRows x = HalfRows(pc.x);
  HalfRows w = HalfRows(pc.w);
  FloatRows y = FloatRows(pc.y);
  const tensorViewNV<2, false, 1, 0> transposed = createTensorViewNV(2, false, 1, 0);
  ACC acc = ACC(0.0);
  // Row strides with their low bits cleared (the launcher guarantees k % 8 == 0 and n % 4 == 0):
  // the driver then knows every row starts 16-byte aligned and loads whole vectors; with the
  // strides as they came (the dimensions' defaults) it could not, and the same kernel ran at a
  // fifth of the rate (H200: 45 against 208-245 TFLOP/s at the 1B projections).
  const uint k_stride = pc.k & ~7u;
  const uint n_stride = pc.n & ~3u;
  if (row0 + BM <= pc.rows && col0 + BN <= pc.n && pc.k % BK == 0) {
    // The common tile: wholly inside, no clamping to check. UNROLL steps per iteration, then the
    // steps left over; the products are summed in the same order either way.
    tensorLayoutNV<2> la = setTensorLayoutDimensionNV(createTensorLayoutNV(2), pc.rows, pc.k);
    tensorLayoutNV<2> lb = setTensorLayoutDimensionNV(createTensorLayoutNV(2), pc.n, pc.k);
    la = setTensorLayoutStrideNV(la, k_stride, 1);
    lb = setTensorLayoutStrideNV(lb, k_stride, 1);
    uint k0 = 0;
    for (; k0 + UNROLL * BK <= pc.k; k0 += UNROLL * BK) {
      [[unroll]] for (uint u = 0; u < UNROLL; ++u) {
        TILE_A a;
        TILE_B b;
        coopMatLoadTensorNV(a, x.v, 0, sliceTensorLayoutNV(la, row0, BM, k0 + u * BK, BK));
        coopMatLoadTensorNV(b, w.v, 0, sliceTensorLayoutNV(lb, col0, BN, k0 + u * BK, BK), transposed);
        acc = coopMatMulAdd(a, b, acc);
      }
    }
    for (; k0 < pc.k; k0 += BK) {
      TILE_A a;
      TILE_B b;
      coopMatLoadTensorNV(a, x.v, 0, sliceTensorLayoutNV(la, row0, BM, k0, BK));
      coopMatLoadTensorNV(b, w.v, 0, sliceTensorLayoutNV(lb, col0, BN, k0, BK), transposed);
      acc = coopMatMulAdd(a, b, acc);
    }
  } else {
    tensorLayoutNV<2, CLAMPED> la = setTensorLayoutDimensionNV(createTensorLayoutNV(2, CLAMPED), pc.rows, pc.k);
    tensorLayoutNV<2, CLAMPED> lb = setTensorLayoutDimensionNV(createTensorLayoutNV(2, CLAMPED), pc.n, pc.k);
    la = setTensorLayoutStrideNV(la, k_stride, 1);
    lb = setTensorLayoutStrideNV(lb, k_stride, 1);
    for (uint k0 = 0; k0 < pc.k; k0 += BK) {
      TILE_A a;
      TILE_B b;
      coopMatLoadTensorNV(a, x.v, 0, sliceTensorLayoutNV(la, row0, BM, k0, BK));
      coopMatLoadTensorNV(b, w.v, 0, sliceTensorLayoutNV(lb, col0, BN, k0, BK), transposed);
      acc = coopMatMulAdd(a, b, acc);
    }
  }
  tensorLayoutNV<2, CLAMPED> ly = setTensorLayoutDimensionNV(createTensorLayoutNV(2, CLAMPED), pc.rows, pc.n);
  ly = setTensorLayoutStrideNV(ly, n_stride, 1);
  if (pc.accumulate != 0) {
    // One f32 add per element, y's old value first: the bits matmul_coopmat.glsl's epilogue gives.
    ACC old;
    coopMatLoadTensorNV(old, y.v, 0, sliceTensorLayoutNV(ly, row0, BM, col0, BN));
    acc = old + acc;
  }
  coopMatStoreTensorNV(acc, y.v, 0, sliceTensorLayoutNV(ly, row0, BM, col0, BN));
}
