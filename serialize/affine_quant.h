// CPU affine group quantization, MLX's scheme: groups of `group_size` consecutive values share a
// scale and a bias stored in the tensor's dtype, w ~= scale * q + bias, q in [0, 2^bits - 1],
// packed little-end first into uint32 words (value k of a word at bits [k*bits, (k+1)*bits)).
//
// Scale/bias choice follows MLX: the endpoint of larger magnitude ("edge") is made exactly
// representable (scale = edge / round(edge / scale0), bias = edge). Where MLX divides, we multiply
// by a correctly rounded reciprocal, and q is computed against the scale and bias *as stored*
// (rounded to the dtype). Both choices exist so the GPU kernel (kernels/blocks/quantize.comp)
// reproduces this bit for bit: Vulkan guarantees correctly rounded +, -, * but not division. Data
// quantized by MLX dequantizes identically here; our quantizer may pick a different level than
// MLX's in rare near-ties.
//
// Dequantization is the reference formula out = round_to_dtype(fl(fl(scale * q) + bias)): one
// rounding after the multiply, one after the add, then to the dtype. No FMA.
#pragma once

#include <cstdint>
#include <span>

#include "base/status.h"
#include "serialize/dtype.h"
#include "serialize/kv_layout.h"

namespace kvtier {

struct QuantizedSizes {
  size_t packed_words = 0;  // uint32 words of q
  size_t groups = 0;        // scales (and biases) per tensor
};
// `elements` must be a multiple of group_size (KvLayout::validate guarantees it per head row).
QuantizedSizes quantized_sizes(size_t elements, const Quantization& q);

// Quantizes `values` (elements of `dtype`). Fails on non-finite input (inf/NaN have no affine
// code) and on mismatched span sizes; writes nothing in that case.
Status affine_quantize(DType dtype, std::span<const uint8_t> values, const Quantization& q,
                       std::span<uint32_t> packed, std::span<uint8_t> scales,
                       std::span<uint8_t> biases);

// Expands packed q with scales/biases into `out` (elements of `dtype`). Deterministic, exact to the
// formula above. Span sizes are checked.
Status affine_dequantize(DType dtype, const Quantization& q, std::span<const uint32_t> packed,
                         std::span<const uint8_t> scales, std::span<const uint8_t> biases,
                         std::span<uint8_t> out);

}  // namespace kvtier
