#version 460
// quantize: MLX-style affine group quantization, bit-identical to serialize/affine_quant.cc (see
// the formula there): divisions become multiplications by correctly rounded reciprocals, and q is
// computed against the scale and bias as stored in the dtype. One invocation per pair of groups,
// so 16-bit scales and biases are written as whole words (the launcher pads those arrays to 4
// bytes). A non-finite input sets `status` to 1 and writes nothing for its group.
#extension GL_GOOGLE_include_directive : require
#include "common/bda.glsl"
#include "common/dtype.glsl"
#include "common/exact_math.glsl"

layout(local_size_x = 64) in;

layout(push_constant) uniform Params {
  uint64_t values;  // dtype [n]
  uint64_t packed;  // u32 [n * bits / 32]
  uint64_t scales;  // dtype [groups], padded to 4 bytes
  uint64_t biases;
  uint64_t status;  // u32 [1]
  uint groups;
  uint bits;
  uint group_size;
  uint dtype;
  float inv_n_bins;  // 1 / (2^bits - 1), correctly rounded on the host
} pc;

// Quantizes group g; returns false on a non-finite value. Outputs its scale and bias (as stored).
bool quantize_group(uint g, out float scale_stored, out float bias_stored, out uint scale_bits,
                    out uint bias_bits) {
  const uint base = g * pc.group_size;
  float w_min = 1.0 / 0.0, w_max = -1.0 / 0.0;
  for (uint j = 0; j < pc.group_size; ++j) {
    float w = kv_load(pc.values, pc.dtype, base + j);
    if (isinf(w) || isnan(w)) return false;
    w_min = min(w_min, w);
    w_max = max(w_max, w);
  }
  const float n_bins = float((1u << pc.bits) - 1u);
  const bool min_is_edge = abs(w_min) > abs(w_max);
  precise float range = w_max - w_min;
  precise float s0 = range * pc.inv_n_bins;
  float scale = max(s0, 1e-7);
  if (!min_is_edge) scale = -scale;
  const float edge = min_is_edge ? w_min : w_max;
  precise float e_over_s = edge * recip_exact(scale);
  const float q0 = roundEven(e_over_s);
  float bias = 0.0;
  if (q0 != 0.0) {
    precise float s1 = edge * recip_exact(q0);
    scale = s1;
    bias = edge;
  }
  if (pc.dtype == DT_F32) {
    scale_bits = floatBitsToUint(scale);
    bias_bits = floatBitsToUint(bias);
    scale_stored = scale;
    bias_stored = bias;
  } else {
    scale_bits = to_dtype_bits(scale, pc.dtype);
    bias_bits = to_dtype_bits(bias, pc.dtype);
    scale_stored = pc.dtype == DT_BF16 ? bf16_to_f32(scale_bits) : f16_to_f32(scale_bits);
    bias_stored = pc.dtype == DT_BF16 ? bf16_to_f32(bias_bits) : f16_to_f32(bias_bits);
  }
  const float inv_s = scale_stored == 0.0 ? 0.0 : recip_exact(scale_stored);
  const uint per_word = 32 / pc.bits;
  for (uint wi = 0; wi < pc.group_size / per_word; ++wi) {
    uint word = 0;
    for (uint k = 0; k < per_word; ++k) {
      const float w = kv_load(pc.values, pc.dtype, base + wi * per_word + k);
      precise float centered = w - bias_stored;
      precise float t = centered * inv_s;
      const float level = clamp(roundEven(t), 0.0, n_bins);
      word |= uint(level) << (k * pc.bits);
    }
    U32Ref(pc.packed + uint64_t(base / per_word + wi) * 4).v[0] = word;
  }
  return true;
}

void main() {
  const uint g0 = gl_GlobalInvocationID.x * 2;
  if (g0 >= pc.groups) return;
  float s0, b0, s1, b1;
  uint sb0 = 0, bb0 = 0, sb1 = 0, bb1 = 0;
  bool ok = quantize_group(g0, s0, b0, sb0, bb0);
  if (g0 + 1 < pc.groups) ok = quantize_group(g0 + 1, s1, b1, sb1, bb1) && ok;
  if (!ok) {
    atomicOr(U32Ref(pc.status).v[0], 1u);
    return;
  }
  if (pc.dtype == DT_F32) {
    U32Ref(pc.scales).v[g0] = sb0;
    U32Ref(pc.biases).v[g0] = bb0;
    if (g0 + 1 < pc.groups) {
      U32Ref(pc.scales).v[g0 + 1] = sb1;
      U32Ref(pc.biases).v[g0 + 1] = bb1;
    }
  } else {
    U32Ref(pc.scales).v[g0 / 2] = sb0 | (sb1 << 16);
    U32Ref(pc.biases).v[g0 / 2] = bb0 | (bb1 << 16);
  }
}
