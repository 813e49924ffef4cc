#include "engine/blocks/affine_quant_kernels.h"

#include "engine/attention/paged_kv.h"

namespace kvtier {

namespace {
struct QuantParams {
  uint64_t values, packed, scales, biases, status;
  uint32_t groups, bits, group_size, dtype;
  float inv_n_bins;
  uint32_t pad;
};
struct DequantParams {
  uint64_t packed, scales, biases, out;
  uint32_t words, bits, group_size, dtype;
};

Status check(DType dtype, const Quantization& q, uint64_t n) {
  if (!is_kv_dtype(dtype)) return invalid_argument("affine quantization needs F32, F16 or BF16");
  if ((q.bits != 4 && q.bits != 8) || (q.group_size != 32 && q.group_size != 64 && q.group_size != 128)) {
    return invalid_argument("quantization: bits 4/8, group 32/64/128");
  }
  if (n % q.group_size != 0) return invalid_argument("quantization: n is not a multiple of group_size");
  if (n / q.group_size > UINT32_MAX / 2) return invalid_argument("quantization: tensor too large");
  return ok_status();
}
}  // namespace

uint64_t AffineQuantKernels::scales_bytes(uint64_t n, const Quantization& q, DType dtype) {
  return (n / q.group_size * dtype_size(dtype) + 3) / 4 * 4;
}

Status AffineQuantKernels::record_quantize(CommandBatch& batch, DType dtype, const Quantization& q,
                                           uint64_t n, uint64_t values, uint64_t packed,
                                           uint64_t scales, uint64_t biases, uint64_t status) {
  KVTIER_RETURN_IF_ERROR(check(dtype, q, n));
  if (n == 0) return ok_status();
  if (!ctx_.info().has_float64) {
    return unavailable("GPU quantization needs shaderFloat64 (for exactly rounded reciprocals); " +
                       ctx_.info().name + " has none: quantize on the CPU");
  }
  KVTIER_ASSIGN_OR_RETURN(auto pipeline, ctx_.pipeline("quantize", {}, sizeof(QuantParams)));
  const uint32_t groups = static_cast<uint32_t>(n / q.group_size);
  // Computed here, in IEEE float, exactly as the CPU quantizer does.
  const float inv_n_bins = 1.0f / static_cast<float>((1 << q.bits) - 1);
  QuantParams p{values, packed, scales, biases, status, groups,
                static_cast<uint32_t>(q.bits), static_cast<uint32_t>(q.group_size),
                kernel_dtype(dtype), inv_n_bins, 0};
  const uint32_t pairs = (groups + 1) / 2;
  batch.dispatch(*pipeline, p, (pairs + 63) / 64);
  batch.barrier();
  return ok_status();
}

Status AffineQuantKernels::record_dequantize(CommandBatch& batch, DType dtype, const Quantization& q,
                                             uint64_t n, uint64_t packed, uint64_t scales,
                                             uint64_t biases, uint64_t out) {
  KVTIER_RETURN_IF_ERROR(check(dtype, q, n));
  if (n == 0) return ok_status();
  KVTIER_ASSIGN_OR_RETURN(auto pipeline, ctx_.pipeline("dequantize", {}, sizeof(DequantParams)));
  const uint32_t words = static_cast<uint32_t>(n * q.bits / 32);
  DequantParams p{packed, scales, biases, out, words, static_cast<uint32_t>(q.bits),
                  static_cast<uint32_t>(q.group_size), kernel_dtype(dtype)};
  batch.dispatch(*pipeline, p, (words + 255) / 256);
  batch.barrier();
  return ok_status();
}

}  // namespace kvtier
