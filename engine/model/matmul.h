// Matmul: y = (accumulate ? y : 0) + x @ w, activations [rows, k] and a weight matrix [k, n], for
// the model's projections. Three kernels, each with its own bits:
//  * matmul.comp: f32 FMAs, everywhere (lavapipe included);
//  * kernels/common/matmul_coopmat.glsl: tensor cores through cooperative matrices (64 x 64 tiles,
//    f32 rows rounded to f16 as they are loaded; its KHR spelling where DeviceInfo::coopmat_khr);
//  * kernels/coopmat2/matmul_cm2.comp: cooperative matrix 2 with tensor-layout loads, where
//    DeviceInfo::coopmat2_tensor_loads (NVIDIA's Hopper: the H100 and H200): large workgroup tiles
//    at the tensor cores' rate, reading f16 rows its producer wrote (MatmulInput::f16) and weights
//    stored transposed.
// Whichever runs, a row's values depend on that row alone, never on the rows beside it, nor on the
// tile the launcher picks for the launch's size.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "engine/vulkan/command_batch.h"
#include "engine/vulkan/gpu_buffer.h"

namespace kvtier {

// How a weight matrix is kept on the GPU, by the kernel it goes through.
enum class MatmulKernel { kScalar, kCoopmat, kTensorLoads };

// A weight matrix on the GPU, in the one form its kernel reads.
struct MatmulWeights {
  GpuBuffer f32;   // kScalar: f32 [k, n]
  GpuBuffer f16;   // kCoopmat: f16 [k, n]
  GpuBuffer f16t;  // kTensorLoads: f16 [n, k], the transpose
  uint32_t k = 0, n = 0;

  // `tensor_cores`: the f16 form of the device's tensor-core kernel (values beyond f16's range
  // clamped, as activations are) where the shape suits it (k % 32 == 0, n % 64 == 0); else f32.
  // Rows of [k, n] must be 16-byte aligned: k and n multiples of 4.
  static Result<MatmulWeights> upload(VulkanContext& ctx, std::span<const float> values, uint32_t k, uint32_t n,
                                      bool tensor_cores);
  MatmulKernel kernel() const {
    return f16t.size() > 0  ? MatmulKernel::kTensorLoads
           : f16.size() > 0 ? MatmulKernel::kCoopmat
                            : MatmulKernel::kScalar;
  }
  bool on_tensor_cores() const { return kernel() != MatmulKernel::kScalar; }
  // The kernel reads f16 input rows (MatmulInput::f16) rather than f32 ones.
  bool takes_half_input() const { return kernel() == MatmulKernel::kTensorLoads; }
};

// A matmul's input rows, as device addresses: f32 (16-byte aligned rows), and the same values as
// f16 where the producer also wrote them (common/half_pack.glsl's rounding; 16-byte aligned rows).
// Weights that take_half_input() read only `f16`; the others only `f32`.
struct MatmulInput {
  uint64_t f32 = 0;
  uint64_t f16 = 0;
};

// matmul_cm2's workgroup tile: invocations, rows, columns, k per step, and steps per loop
// iteration (unrolled, where k allows).
struct MatmulTile {
  uint32_t threads, rows, cols, k_step, unroll = 8;
  uint32_t group_m = 0;  // row tiles walked together (0: Matmul::row_tile_group's choice)
  bool operator==(const MatmulTile&) const = default;
};

// One output of a segmented launch: `cols` columns of the weights, written to f32 rows at y.
struct MatmulSegment {
  uint64_t y;
  uint32_t cols;
};

class Matmul {
 public:
  explicit Matmul(VulkanContext& ctx) : ctx_(ctx) {}
  // y: f32 rows; `rows` of them. `tile` (kTensorLoads only) overrides the launcher's choice: for
  // benchmarks and the tests that hold the bits equal across tiles.
  Status record(CommandBatch& batch, MatmulInput x, const MatmulWeights& w, uint64_t y,
                uint32_t rows, bool accumulate, std::optional<MatmulTile> tile = std::nullopt);
  // SwiGLU's first half in one launch (kTensorLoads only): y16 = f16(silu(x gate) * (x up)), the
  // values and rounding silu_mul.comp gives from two f32 launches, without their [rows, n] f32
  // round trips. y16: f16 rows of gate.n values, not overlapping x.
  Status record_gated(CommandBatch& batch, MatmulInput x, const MatmulWeights& gate,
                      const MatmulWeights& up, uint64_t y16, uint32_t rows,
                      std::optional<MatmulTile> tile = std::nullopt);
  // Projections that read the same rows in one launch (kTensorLoads only): `w` holds their
  // weights side by side ([k, sum of cols]), and each segment's columns go to its own f32 rows —
  // the bits separate launches give. Widths multiples of 32.
  Status record_segments(CommandBatch& batch, MatmulInput x, const MatmulWeights& w,
                         std::span<const MatmulSegment> segments, uint32_t rows);
  // f16 copies of `count` f32 values (a multiple of 4), for the input of a kTensorLoads matmul
  // whose producer wrote only f32. The matmul reading them must come after a barrier.
  Status record_half_copy(CommandBatch& batch, uint64_t x, uint64_t out, uint64_t count);

  // The tiles matmul_cm2 runs with, largest first, and the one the launcher picks; more shapes
  // for benchmarks to compare (the launcher's first).
  static std::span<const MatmulTile> tiles();
  static std::span<const MatmulTile> candidate_tiles();
  // `sms`: the device's multiprocessors (DeviceInfo::sm_count; 0: unknown). `gated`: for
  // record_gated's launch, whose two accumulators make the smaller tiles slow.
  static MatmulTile pick_tile(uint32_t rows, uint32_t n, uint32_t col_multiple = 0,
                              uint32_t sms = 0, bool gated = false);
  // Row tiles walked together (matmul_cm2's GROUP_M) for weights of this many bytes.
  static uint32_t row_tile_group(uint64_t weight_bytes);

 private:
  struct TensorLoadParams;
  Status record_tensor_loads(CommandBatch& batch, const TensorLoadParams& p, MatmulTile tile,
                             bool gated);
  struct TensorLoadPipeline {
    MatmulTile tile;
    bool gated;
    uint32_t group_m;
    std::shared_ptr<ComputePipeline> pipeline;
  };

  static constexpr uint32_t kDeepStep = 128;  // matmul_coopmat's k step for one row tile
  VulkanContext& ctx_;
  std::shared_ptr<ComputePipeline> scalar_, coopmat_, coopmat_deep_, half_copy_;
  std::vector<TensorLoadPipeline> tensor_loads_;
};

}  // namespace kvtier
