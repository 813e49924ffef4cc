#include "serialize/affine_quant.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace kvtier {

QuantizedSizes quantized_sizes(size_t elements, const Quantization& q) {
  return {elements * static_cast<size_t>(q.bits) / 32, elements / static_cast<size_t>(q.group_size)};
}

namespace {

Status check_sizes(DType dtype, size_t value_bytes, const Quantization& q, size_t packed_words,
                   size_t scale_bytes, size_t bias_bytes) {
  if (!is_kv_dtype(dtype)) {
    return invalid_argument("affine quantization needs F32, F16 or BF16, got " +
                            std::string(dtype_name(dtype)));
  }
  if (q.bits != 4 && q.bits != 8) return invalid_argument("quantization bits must be 4 or 8");
  if (q.group_size != 32 && q.group_size != 64 && q.group_size != 128) {
    return invalid_argument("quantization group_size must be 32, 64 or 128");
  }
  size_t esz = dtype_size(dtype);
  if (value_bytes % esz != 0) return invalid_argument("value bytes are not whole elements");
  size_t n = value_bytes / esz;
  if (n % q.group_size != 0) {
    return invalid_argument(std::to_string(n) + " elements are not a multiple of group_size " +
                            std::to_string(q.group_size));
  }
  QuantizedSizes s = quantized_sizes(n, q);
  if (packed_words != s.packed_words || scale_bytes != s.groups * esz ||
      bias_bytes != s.groups * esz) {
    return invalid_argument("quantized buffer sizes do not match " + std::to_string(n) +
                            " elements at " + std::to_string(q.bits) + " bits, group " +
                            std::to_string(q.group_size));
  }
  return ok_status();
}

}  // namespace

Status affine_quantize(DType dtype, std::span<const uint8_t> values, const Quantization& q,
                       std::span<uint32_t> packed, std::span<uint8_t> scales,
                       std::span<uint8_t> biases) {
  KVTIER_RETURN_IF_ERROR(
      check_sizes(dtype, values.size(), q, packed.size(), scales.size(), biases.size()));
  const size_t n = values.size() / dtype_size(dtype);
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(load_kv_element(dtype, values.data(), i))) {
      return invalid_argument("element " + std::to_string(i) +
                              " is not finite; affine quantization cannot encode inf or NaN");
    }
  }
  const float n_bins = static_cast<float>((1 << q.bits) - 1);
  const float inv_n_bins = 1.0f / n_bins;
  const float eps = 1e-7f;
  const int per_word = 32 / q.bits;
  const size_t groups = n / q.group_size;
  std::fill(packed.begin(), packed.end(), 0u);

  for (size_t g = 0; g < groups; ++g) {
    const size_t base = g * q.group_size;
    float w_min = INFINITY, w_max = -INFINITY;
    for (int j = 0; j < q.group_size; ++j) {
      float w = load_kv_element(dtype, values.data(), base + j);
      w_min = std::min(w_min, w);
      w_max = std::max(w_max, w);
    }
    const bool min_is_edge = std::fabs(w_min) > std::fabs(w_max);
    float scale = std::max((w_max - w_min) * inv_n_bins, eps);
    if (!min_is_edge) scale = -scale;
    const float edge = min_is_edge ? w_min : w_max;
    const float q0 = std::nearbyint(edge * (1.0f / scale));
    float bias = 0.0f;
    if (q0 != 0.0f) {
      scale = edge * (1.0f / q0);
      bias = edge;
    }
    store_kv_element(dtype, scales.data(), g, scale);
    store_kv_element(dtype, biases.data(), g, bias);
    // Quantize against what dequantization will see.
    const float s_stored = load_kv_element(dtype, scales.data(), g);
    const float b_stored = load_kv_element(dtype, biases.data(), g);
    const float inv_s = s_stored == 0.0f ? 0.0f : 1.0f / s_stored;
    for (int j = 0; j < q.group_size; ++j) {
      const size_t i = base + j;
      float w = load_kv_element(dtype, values.data(), i);
      float level = std::nearbyint((w - b_stored) * inv_s);
      level = std::clamp(level, 0.0f, n_bins);
      packed[i / per_word] |= static_cast<uint32_t>(level) << ((i % per_word) * q.bits);
    }
  }
  return ok_status();
}

Status affine_dequantize(DType dtype, const Quantization& q, std::span<const uint32_t> packed,
                         std::span<const uint8_t> scales, std::span<const uint8_t> biases,
                         std::span<uint8_t> out) {
  KVTIER_RETURN_IF_ERROR(
      check_sizes(dtype, out.size(), q, packed.size(), scales.size(), biases.size()));
  const size_t n = out.size() / dtype_size(dtype);
  const int per_word = 32 / q.bits;
  const uint32_t mask = (1u << q.bits) - 1;
  for (size_t i = 0; i < n; ++i) {
    const size_t g = i / q.group_size;
    const float s = load_kv_element(dtype, scales.data(), g);
    const float b = load_kv_element(dtype, biases.data(), g);
    const float level = static_cast<float>((packed[i / per_word] >> ((i % per_word) * q.bits)) & mask);
    const float scaled = s * level;  // rounded on its own (-ffp-contract=off)
    store_kv_element(dtype, out.data(), i, scaled + b);
  }
  return ok_status();
}

}  // namespace kvtier
