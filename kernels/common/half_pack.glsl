// K and V on their way to the tensor cores' f16 inputs: clamped to f16's range (+-65504), then
// converted with the device's rounding (bf16 converts exactly inside f16's normal range). One
// definition for the attention kernel's conversion of a chunk and for the staging pass
// (attention/kv_half_staging.comp), so that a row's bits do not depend on which of them ran.
// Needs common/dtype.glsl.
const float F16_MAX = 65504.0;

uint pack_half2(float a, float b) { return packHalf2x16(clamp(vec2(a, b), -F16_MAX, F16_MAX)); }

// One 16-byte load of 8 bf16 values as 8 f16 values.
uvec4 half8_from_bf16(uvec4 w) {
  float f[8];
  unpack8(w, DT_BF16, f);
  uvec4 out_;
  [[unroll]] for (uint i = 0; i < 4; ++i) out_[i] = pack_half2(f[2 * i], f[2 * i + 1]);
  return out_;
}

// One 16-byte load of 4 f32 values as 4 f16 values.
uvec2 half4_from_f32(uvec4 w) {
  return uvec2(pack_half2(uintBitsToFloat(w.x), uintBitsToFloat(w.y)),
               pack_half2(uintBitsToFloat(w.z), uintBitsToFloat(w.w)));
}
