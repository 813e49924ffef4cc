// Element types of stored tensors and exact conversions between them. KV data is F32, F16 or
// BF16; quantized payloads use U32 (packed; I32 where a framework has no uint32, as torch), U8
// and I8. bf16 is never routed through f16 (the
// lossy cast that once emptied another server's SSD tier): it is kept as its raw 16-bit words.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "base/status.h"

namespace kvtier {

enum class DType : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2, kU32 = 3, kU8 = 4, kI8 = 5, kI32 = 6 };

// Names as safetensors writes them: "F32", "F16", "BF16", "U32", "U8", "I8", "I32".
std::string_view dtype_name(DType d);
Result<DType> parse_dtype(std::string_view name);
size_t dtype_size(DType d);
// True for the dtypes a KV layer may hold (F32, F16, BF16).
bool is_kv_dtype(DType d);

// f32 -> f16, round to nearest even; overflow goes to inf, NaN stays NaN (payload's top bits kept,
// quiet bit forced so a payload can never collapse into inf).
uint16_t f32_to_f16(float f);
float f16_to_f32(uint16_t h);  // exact
// f32 -> bf16, round to nearest even, NaN stays NaN (quiet bit forced, as above).
uint16_t f32_to_bf16(float f);
inline float bf16_to_f32(uint16_t b) { return std::bit_cast<float>(uint32_t{b} << 16); }  // exact

// Reads element `i` of a KV array of dtype `d` (F32/F16/BF16) as float, exactly.
inline float load_kv_element(DType d, const uint8_t* base, size_t i) {
  switch (d) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, base + 4 * i, 4);
      return f;
    }
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, base + 2 * i, 2);
      return f16_to_f32(h);
    }
    default: {
      uint16_t b;
      std::memcpy(&b, base + 2 * i, 2);
      return bf16_to_f32(b);
    }
  }
}

// Writes `v` rounded to dtype `d` (F32/F16/BF16) into element `i`.
inline void store_kv_element(DType d, uint8_t* base, size_t i, float v) {
  switch (d) {
    case DType::kF32:
      std::memcpy(base + 4 * i, &v, 4);
      return;
    case DType::kF16: {
      uint16_t h = f32_to_f16(v);
      std::memcpy(base + 2 * i, &h, 2);
      return;
    }
    default: {
      uint16_t b = f32_to_bf16(v);
      std::memcpy(base + 2 * i, &b, 2);
      return;
    }
  }
}

// Rounds a float to the precision of dtype `d` and back (identity for F32).
float round_to_dtype(DType d, float v);

}  // namespace kvtier
