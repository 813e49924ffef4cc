// AffineQuantKernels launches kernels/blocks/quantize.comp and dequantize.comp: MLX-style affine
// group quantization of a tensor in its dtype, bit-identical to serialize/affine_quant.cc (see
// there for the scheme and why divisions are reciprocals). Buffer layouts: values and out [n] in
// the dtype; packed u32 [n * bits / 32]; scales and biases [n / group_size] in the dtype, each
// padded to a multiple of 4 bytes (scales_bytes()).
#pragma once

#include "engine/vulkan/command_batch.h"
#include "serialize/kv_layout.h"

namespace kvtier {

class AffineQuantKernels {
 public:
  explicit AffineQuantKernels(VulkanContext& ctx) : ctx_(ctx) {}
  static uint64_t scales_bytes(uint64_t n, const Quantization& q, DType dtype);

  // `status` is a device u32 the caller zeroes; it becomes 1 if any value was not finite (those
  // groups are not written: the caller must treat the result as invalid).
  Status record_quantize(CommandBatch& batch, DType dtype, const Quantization& q, uint64_t n,
                         uint64_t values, uint64_t packed, uint64_t scales, uint64_t biases,
                         uint64_t status);
  Status record_dequantize(CommandBatch& batch, DType dtype, const Quantization& q, uint64_t n,
                           uint64_t packed, uint64_t scales, uint64_t biases, uint64_t out);

 private:
  VulkanContext& ctx_;
};

}  // namespace kvtier
