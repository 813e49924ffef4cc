#extension GL_EXT_control_flow_attributes : require
// KV element types held as raw words: 0 = F32, 1 = F16, 2 = BF16 (matching serialize/dtype.h).
// Conversions to 16-bit formats round to nearest even exactly as serialize/dtype.cc does (the
// hardware's packHalf2x16 rounding is implementation-defined), so GPU and CPU agree bit for bit.
#define DT_F32 0
#define DT_F16 1
#define DT_BF16 2

float bf16_to_f32(uint bits16) { return uintBitsToFloat(bits16 << 16); }

uint f32_to_bf16(float f) {
  uint x = floatBitsToUint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return ((x >> 16) | 0x40u) & 0xffffu;  // NaN stays NaN
  return ((x + 0x7fffu + ((x >> 16) & 1u)) >> 16) & 0xffffu;
}

// Exact for every f16 value, subnormals and NaN payloads included, on every device (NVIDIA's
// unpackHalf2x16 does not keep them: measured). Attention's hot loop uses unpackHalf2x16 (see
// unpack8): there a flushed f16 subnormal (< 6e-5) changes nothing that matters.
float f16_to_f32(uint h) {
  uint sign = (h & 0x8000u) << 16;
  uint e = (h >> 10) & 0x1fu;
  uint m = h & 0x3ffu;
  if (e == 0u) {
    // Zero or subnormal: m * 2^-24, exact in f32 (and normal there, so never flushed).
    const float v = float(m) * uintBitsToFloat(0x33800000u);
    return sign != 0u ? -v : v;
  }
  if (e == 0x1fu) return uintBitsToFloat(sign | 0x7f800000u | (m << 13));
  return uintBitsToFloat(sign | ((e + 112u) << 23) | (m << 13));
}

uint f32_to_f16(float f) {
  uint x = floatBitsToUint(f);
  uint sign = (x >> 16) & 0x8000u;
  uint a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7c00u | 0x0200u | ((a >> 13) & 0x03ffu);
  if (a >= 0x477ff000u) return sign | 0x7c00u;
  if (a < 0x38800000u) {
    if (a < 0x33000000u) return sign;
    uint e = a >> 23;
    uint m = (a & 0x7fffffu) | 0x800000u;
    uint shift = 126u - e;
    uint q = m >> shift;
    uint rem = m & ((1u << shift) - 1u);
    uint half_ = 1u << (shift - 1u);
    if (rem > half_ || (rem == half_ && (q & 1u) != 0u)) q += 1u;
    return sign | q;
  }
  uint rounded = a + 0x0fffu + ((a >> 13) & 1u);
  return sign | ((rounded - 0x38000000u) >> 13);
}

// Element `i` of a KV array of dtype `dt` at `base`, as float (exact).
float kv_load(uint64_t base, uint dt, uint64_t i) {
  if (dt == DT_F32) return F32Ref(base).v[uint(i)];
  uint w = U32Ref(base + (i >> 1) * 4).v[0];
  uint h = ((i & 1) == 0) ? (w & 0xffffu) : (w >> 16);
  return dt == DT_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

uint to_dtype_bits(float f, uint dt) { return dt == DT_BF16 ? f32_to_bf16(f) : f32_to_f16(f); }

// Unpacks one 16-byte load of dtype `dt` into up to 8 floats (f32: 4 values, 16-bit: 8).
void unpack8(uvec4 w, uint dt, out float v[8]) {
  if (dt == DT_F32) {
    [[unroll]] for (int k = 0; k < 4; ++k) v[k] = uintBitsToFloat(w[k]);
    [[unroll]] for (int k = 4; k < 8; ++k) v[k] = 0.0;
  } else if (dt == DT_BF16) {
    [[unroll]] for (int k = 0; k < 4; ++k) {
      v[2 * k] = uintBitsToFloat(w[k] << 16);
      v[2 * k + 1] = uintBitsToFloat(w[k] & 0xffff0000u);
    }
  } else {
    [[unroll]] for (int k = 0; k < 4; ++k) {
      vec2 p = unpackHalf2x16(w[k]);
      v[2 * k] = p.x;
      v[2 * k + 1] = p.y;
    }
  }
}
