// Matmul: y = (accumulate ? y : 0) + x @ w, f32 activations [rows, k] and a weight matrix [k, n],
// for the tiny model. Two kernels, two sets of bits: matmul.comp (f32 FMAs, everywhere) and, on
// devices with cooperative matrices, kernels/common/matmul_coopmat.glsl (tensor cores, f16 inputs,
// f32 sums; in its KHR spelling where the device has cooperative matrix 2, DeviceInfo::coopmat_khr).
// Either way a row's values depend on that row alone, never on the rows beside it.
#pragma once

#include <memory>
#include <span>

#include "engine/vulkan/command_batch.h"
#include "engine/vulkan/gpu_buffer.h"

namespace kvtier {

// A weight matrix on the GPU: f32 always, and f16 where it goes through the tensor-core kernel.
struct MatmulWeights {
  GpuBuffer f32, f16;
  uint32_t k = 0, n = 0;

  // `tensor_cores`: keep an f16 copy (values beyond f16's range clamped, as the kernel clamps
  // activations) when the device has cooperative matrices and the shape suits the kernel
  // (k % 32 == 0, n % 64 == 0). Rows of [k, n] must be 16-byte aligned: k and n multiples of 4.
  static Result<MatmulWeights> upload(VulkanContext& ctx, std::span<const float> values, uint32_t k, uint32_t n,
                                      bool tensor_cores);
  bool on_tensor_cores() const { return f16.size() > 0; }
};

class Matmul {
 public:
  explicit Matmul(VulkanContext& ctx) : ctx_(ctx) {}
  // x and y are device addresses of f32 rows (16-byte aligned); `rows` of them.
  Status record(CommandBatch& batch, uint64_t x, const MatmulWeights& w, uint64_t y, uint32_t rows,
                bool accumulate);

 private:
  static constexpr uint32_t kDeepStep = 128;  // matmul_coopmat's k step for one row tile
  VulkanContext& ctx_;
  std::shared_ptr<ComputePipeline> scalar_, coopmat_, coopmat_deep_;
};

}  // namespace kvtier
