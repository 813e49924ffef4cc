#include "serialize/dtype.h"

#include <bit>
#include <cmath>
#include <random>

#include <gtest/gtest.h>

namespace kvtier {
namespace {

bool is_nan16_f16(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x03ff) != 0; }
bool is_nan16_bf16(uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x007f) != 0; }

TEST(DTypeTest, NamesMatchSafetensorsAndRoundTrip) {
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16, DType::kU32, DType::kU8, DType::kI8,
                  DType::kI32}) {
    auto parsed = parse_dtype(dtype_name(d));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, d);
  }
  EXPECT_EQ(dtype_name(DType::kBF16), "BF16");
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_EQ(dtype_size(DType::kF32), 4u);
  EXPECT_EQ(dtype_size(DType::kU8), 1u);
  EXPECT_EQ(dtype_size(DType::kI32), 4u);
  EXPECT_FALSE(parse_dtype("bf16").ok()) << "names are case-sensitive, as in safetensors";
  EXPECT_FALSE(parse_dtype("FP16").ok());
}

TEST(DTypeTest, EveryF16PatternSurvivesF32AndBack) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const uint16_t back = f32_to_f16(f16_to_f32(h));
    if (is_nan16_f16(h)) {
      // Quiet NaNs round-trip exactly; signalling ones come back quiet with sign and payload kept.
      EXPECT_TRUE(is_nan16_f16(back)) << std::hex << h;
      EXPECT_EQ(back, h | 0x0200) << std::hex << h;
    } else {
      EXPECT_EQ(back, h) << std::hex << h;
    }
  }
}

TEST(DTypeTest, EveryBf16PatternSurvivesF32AndBack) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t b = static_cast<uint16_t>(i);
    const uint16_t back = f32_to_bf16(bf16_to_f32(b));
    if (is_nan16_bf16(b)) {
      EXPECT_TRUE(is_nan16_bf16(back)) << std::hex << b;
      EXPECT_EQ(back, b | 0x0040) << std::hex << b;
    } else {
      EXPECT_EQ(back, b) << std::hex << b;
    }
  }
}

// GCC's _Float16 conversion (libgcc, correctly rounded) is an independent reference.
TEST(DTypeTest, F32ToF16MatchesCompilerConversionOnRandomAndEdgeValues) {
  std::mt19937 rng(7);
  auto check = [](uint32_t bits) {
    const float f = std::bit_cast<float>(bits);
    if (std::isnan(f)) return;
    const _Float16 ref = static_cast<_Float16>(f);
    const uint16_t ref_bits = std::bit_cast<uint16_t>(ref);
    ASSERT_EQ(f32_to_f16(f), ref_bits) << "f32 bits 0x" << std::hex << bits;
  };
  for (int i = 0; i < 2'000'000; ++i) check(static_cast<uint32_t>(rng()));
  // Around every f16 rounding boundary region: exponents of subnormals, normals and overflow.
  for (uint32_t e = 100; e <= 145; ++e) {
    for (uint32_t m = 0; m < (1u << 23); m += 997) {
      check((e << 23) | m);
      check(0x80000000u | (e << 23) | m);
    }
    check((e << 23) | 0x1000);  // exact ties in the normal range
    check((e << 23) | 0x3000);
  }
}

TEST(DTypeTest, F32ToBf16RoundsToNearestEven) {
  // Reference: pick the nearer of the two bf16 neighbours in double precision; ties to even.
  std::mt19937 rng(11);
  for (int i = 0; i < 2'000'000; ++i) {
    const uint32_t bits = static_cast<uint32_t>(rng());
    const float f = std::bit_cast<float>(bits);
    if (std::isnan(f) || std::isinf(f)) continue;
    const uint16_t lo = static_cast<uint16_t>(bits >> 16);  // truncation toward zero
    const uint16_t hi = static_cast<uint16_t>(lo + 1);       // next magnitude up
    const double dl = bf16_to_f32(lo);
    const double dh = (hi & 0x7f80) == 0x7f80 && (hi & 0x7f) == 0 ? std::copysign(INFINITY, f)
                                                                   : bf16_to_f32(hi);
    const double err_l = std::fabs(static_cast<double>(f) - dl);
    // Overflow: the "hi" neighbour is inf, which is taken when f is at or past the midpoint.
    const double mid_gap = std::ldexp(1.0, ((bits >> 23) & 0xff) - 127 - 7);
    const double err_h = std::isinf(dh) ? mid_gap - err_l : std::fabs(static_cast<double>(f) - dh);
    uint16_t want = err_l < err_h ? lo : err_h < err_l ? hi : ((lo & 1) ? hi : lo);
    ASSERT_EQ(f32_to_bf16(f), want) << "f32 bits 0x" << std::hex << bits;
  }
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x3f808000u)), 0x3f80) << "tie to even (down)";
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x3f818000u)), 0x3f82) << "tie to even (up)";
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x7f7fffffu)), 0x7f80) << "FLT_MAX rounds to inf";
}

TEST(DTypeTest, NanStaysNanWithSignAndTopPayloadBits) {
  const float payload_nan = std::bit_cast<float>(0xffa5a000u);  // negative, payload set
  const uint16_t b = f32_to_bf16(payload_nan);
  EXPECT_TRUE(is_nan16_bf16(b));
  EXPECT_EQ(b & 0x8000, 0x8000);
  EXPECT_EQ(b, 0xffe5);  // top 7 payload bits 0x25 kept, quiet bit forced
  // A signalling NaN whose payload sits only in the low bits must not turn into inf.
  EXPECT_TRUE(is_nan16_bf16(f32_to_bf16(std::bit_cast<float>(0x7f800001u))));
  EXPECT_TRUE(is_nan16_f16(f32_to_f16(std::bit_cast<float>(0x7f800001u))));
}

TEST(DTypeTest, ElementAccessIsExactForEveryKvDtype) {
  uint8_t buf[16] = {};
  store_kv_element(DType::kBF16, buf, 3, 1.5f);
  EXPECT_EQ(load_kv_element(DType::kBF16, buf, 3), 1.5f);
  store_kv_element(DType::kF16, buf, 2, -0.000061035156f);  // smallest normal f16, negated
  EXPECT_EQ(load_kv_element(DType::kF16, buf, 2), -0.000061035156f);
  store_kv_element(DType::kF32, buf, 1, 3.14159274f);
  EXPECT_EQ(load_kv_element(DType::kF32, buf, 1), 3.14159274f);
}

}  // namespace
}  // namespace kvtier
