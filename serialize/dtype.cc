#include "serialize/dtype.h"

#include <string>

namespace kvtier {

std::string_view dtype_name(DType d) {
  switch (d) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kU32: return "U32";
    case DType::kU8: return "U8";
    case DType::kI8: return "I8";
    case DType::kI32: return "I32";
  }
  return "?";
}

Result<DType> parse_dtype(std::string_view name) {
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16, DType::kU32, DType::kU8, DType::kI8,
                  DType::kI32}) {
    if (dtype_name(d) == name) return d;
  }
  return invalid_argument("unknown dtype '" + std::string(name) +
                          "' (expected F32, F16, BF16, U32, U8, I8 or I32)");
}

size_t dtype_size(DType d) {
  switch (d) {
    case DType::kF32:
    case DType::kU32:
    case DType::kI32: return 4;
    case DType::kF16:
    case DType::kBF16: return 2;
    case DType::kU8:
    case DType::kI8: return 1;
  }
  return 0;
}

bool is_kv_dtype(DType d) { return d == DType::kF32 || d == DType::kF16 || d == DType::kBF16; }

uint16_t f32_to_bf16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) {
    // NaN: keep sign and the top 7 payload bits, force the quiet bit.
    return static_cast<uint16_t>((x >> 16) | 0x0040u);
  }
  uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

uint16_t f32_to_f16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) {  // NaN: keep the top 10 payload bits, force quiet.
    return static_cast<uint16_t>(sign | 0x7c00u | 0x0200u | ((abs >> 13) & 0x03ffu));
  }
  if (abs >= 0x477ff000u) {  // >= 65520 rounds to inf (65504 is the largest finite f16)
    return static_cast<uint16_t>(sign | 0x7c00u);
  }
  if (abs < 0x38800000u) {  // below the smallest normal f16 (2^-14): subnormal or zero
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // < 2^-25 rounds to 0
    // Value = mantissa(with hidden bit) * 2^(e-150); f16 subnormal unit = 2^-24.
    uint32_t e = abs >> 23;
    uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;  // 14..24 here: bring the value to units of 2^-24
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  // Normal: rebias exponent (127 -> 15), round mantissa 23 -> 10 bits to nearest even. A carry
  // out of the mantissa correctly bumps the exponent (and 65504+ cases were handled above).
  uint32_t rounded = abs + 0x0fffu + ((abs >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x03ffu;
  uint32_t out;
  if (exp == 0) {
    if (man == 0) {
      out = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while ((man & 0x0400u) == 0);
      out = sign | ((127 - 15 - e) << 23) | ((man & 0x03ffu) << 13);
    }
  } else if (exp == 0x1f) {
    out = sign | 0x7f800000u | (man << 13);
  } else {
    out = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  return std::bit_cast<float>(out);
}

float round_to_dtype(DType d, float v) {
  switch (d) {
    case DType::kF16: return f16_to_f32(f32_to_f16(v));
    case DType::kBF16: return bf16_to_f32(f32_to_bf16(v));
    default: return v;
  }
}

}  // namespace kvtier
