#version 460
// dequantize: MLX-style affine groups back to the tensor dtype, bit-identical to
// serialize/affine_quant.cc: out = round_to_dtype(fl(fl(scale * q) + bias)), one rounding per
// operation (`precise`: no FMA contraction). One invocation per packed 32-bit word; a group holds
// whole words, and a word's 4 or 8 values fill whole 16-bit output words.
#extension GL_GOOGLE_include_directive : require
#include "common/bda.glsl"
#include "common/dtype.glsl"

layout(local_size_x = 256) in;

layout(push_constant) uniform Params {
  uint64_t packed;  // u32 [n * bits / 32]
  uint64_t scales;  // dtype [n / group_size]
  uint64_t biases;  // dtype [n / group_size]
  uint64_t out_;    // dtype [n]
  uint words;
  uint bits;        // 4 or 8
  uint group_size;  // 32, 64, 128
  uint dtype;
} pc;

void main() {
  const uint w = gl_GlobalInvocationID.x;
  if (w >= pc.words) return;
  const uint per_word = 32 / pc.bits;
  const uint mask = (1u << pc.bits) - 1u;
  const uint first = w * per_word;
  const uint g = first / pc.group_size;
  const float s = kv_load(pc.scales, pc.dtype, g);
  const float b = kv_load(pc.biases, pc.dtype, g);
  const uint word = U32Ref(pc.packed).v[w];
  for (uint k = 0; k < per_word; k += 2) {
    precise float p0 = s * float((word >> (k * pc.bits)) & mask);
    precise float v0 = p0 + b;
    precise float p1 = s * float((word >> ((k + 1) * pc.bits)) & mask);
    precise float v1 = p1 + b;
    if (pc.dtype == DT_F32) {
      F32Ref o = F32Ref(pc.out_ + uint64_t(first + k) * 4);
      o.v[0] = v0;
      o.v[1] = v1;
    } else {
      U32Ref(pc.out_ + uint64_t(first + k) * 2).v[0] =
          to_dtype_bits(v0, pc.dtype) | (to_dtype_bits(v1, pc.dtype) << 16);
    }
  }
}
