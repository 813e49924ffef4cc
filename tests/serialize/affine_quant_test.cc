#include "serialize/affine_quant.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "serialize/block.h"
#include "tests/support/test_blocks.h"

namespace kvtier {
namespace {

struct QuantCase {
  DType dtype;
  int bits;
  int group;
};

class AffineQuantTest : public ::testing::TestWithParam<QuantCase> {
 protected:
  std::vector<uint8_t> values(size_t n, uint64_t seed, testing::Values kind) {
    std::vector<uint8_t> v(n * dtype_size(GetParam().dtype));
    std::mt19937_64 rng(seed);
    testing::fill_tensor(GetParam().dtype, v, rng, kind, 128);
    return v;
  }
};

// MLX's scheme makes zero exactly representable: the edge (larger-magnitude endpoint) maps to an
// integer level, which can shorten the covered range [b, b + n_bins*s] by up to one step. So:
//   inside the range:  |w - deq| <= |s|/2                    (rounding to the nearest level)
//   clamped outside:   |w - deq| <= (1 + 1/n_bins) * |s|     (the far endpoint lost to exact zero)
// each plus what storing s and b in the dtype costs (n_bins*|s|*u + |b|*u) and the final rounding
// of the result (|deq|*u), u being the dtype's unit roundoff (2^-8 bf16, 2^-11 f16, 2^-24 f32).
TEST_P(AffineQuantTest, ReconstructionErrorIsWithinTheSchemesBound) {
  const auto [dtype, bits, group] = GetParam();
  const Quantization q{bits, group};
  const size_t n = 16 * 128;
  for (testing::Values kind : {testing::Values::kRandom, testing::Values::kKvLike}) {
    auto v = values(n, 42, kind);
    QuantizedSizes qs = quantized_sizes(n, q);
    std::vector<uint32_t> packed(qs.packed_words);
    std::vector<uint8_t> scales(qs.groups * dtype_size(dtype)), biases(scales.size());
    ASSERT_TRUE(affine_quantize(dtype, v, q, packed, scales, biases).ok());
    std::vector<uint8_t> out(v.size());
    ASSERT_TRUE(affine_dequantize(dtype, q, packed, scales, biases, out).ok());

    const double u = dtype == DType::kBF16 ? 0x1p-8 : dtype == DType::kF16 ? 0x1p-11 : 0x1p-24;
    const double n_bins = (1 << bits) - 1;
    size_t inside = 0;
    for (size_t i = 0; i < n; ++i) {
      const double s_signed = load_kv_element(dtype, scales.data(), i / group);
      const double b_signed = load_kv_element(dtype, biases.data(), i / group);
      const double s = std::fabs(s_signed), b = std::fabs(b_signed);
      const double w = load_kv_element(dtype, v.data(), i);
      const double d = load_kv_element(dtype, out.data(), i);
      const double rounding = b * u + std::fabs(d) * u + 1e-6;
      const double lo = std::min(b_signed, b_signed + n_bins * s_signed);
      const double hi = std::max(b_signed, b_signed + n_bins * s_signed);
      const double err = std::fabs(w - d);
      if (w >= lo && w <= hi) {
        ++inside;
        ASSERT_LE(err, s / 2 + rounding) << "element " << i << " inside the range";
      } else {
        ASSERT_LE(err, (1 + 1 / n_bins) * s + n_bins * s * u + rounding) << "element " << i;
      }
    }
    EXPECT_GT(inside, n * 9 / 10) << "nearly every value lies inside its group's range";
  }
}

TEST_P(AffineQuantTest, DequantizationIsExactlyTheReferenceFormula) {
  const auto [dtype, bits, group] = GetParam();
  const Quantization q{bits, group};
  const size_t n = 4 * 128;
  auto v = values(n, 9, testing::Values::kRandom);
  QuantizedSizes qs = quantized_sizes(n, q);
  std::vector<uint32_t> packed(qs.packed_words);
  std::vector<uint8_t> scales(qs.groups * dtype_size(dtype)), biases(scales.size());
  ASSERT_TRUE(affine_quantize(dtype, v, q, packed, scales, biases).ok());
  std::vector<uint8_t> out(v.size()), again(v.size());
  ASSERT_TRUE(affine_dequantize(dtype, q, packed, scales, biases, out).ok());
  ASSERT_TRUE(affine_dequantize(dtype, q, packed, scales, biases, again).ok());
  EXPECT_EQ(out, again) << "deterministic";

  // Written out independently: level = bits k*bits.. of word i/per_word; one rounding per op.
  const int per_word = 32 / bits;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t level = (packed[i / per_word] >> ((i % per_word) * bits)) & ((1u << bits) - 1);
    volatile float s = load_kv_element(dtype, scales.data(), i / group);
    volatile float prod = s * static_cast<float>(level);
    volatile float sum = prod + load_kv_element(dtype, biases.data(), i / group);
    uint8_t want[4];
    store_kv_element(dtype, want, 0, sum);
    ASSERT_EQ(std::memcmp(want, out.data() + i * dtype_size(dtype), dtype_size(dtype)), 0) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    DtypesBitsGroups, AffineQuantTest,
    ::testing::Values(QuantCase{DType::kBF16, 4, 64}, QuantCase{DType::kBF16, 8, 64},
                      QuantCase{DType::kBF16, 4, 32}, QuantCase{DType::kBF16, 8, 128},
                      QuantCase{DType::kF16, 4, 64}, QuantCase{DType::kF16, 8, 32},
                      QuantCase{DType::kF32, 4, 128}, QuantCase{DType::kF32, 8, 64}),
    [](const ::testing::TestParamInfo<QuantCase>& info) {
      return std::string(dtype_name(info.param.dtype)) + "_b" + std::to_string(info.param.bits) +
             "_g" + std::to_string(info.param.group);
    });

TEST(AffineQuantPackingTest, FollowsMlxLayoutOnAKnownGroup) {
  // 32 values 0..31 in f32, 8 bits, group 32: min 0 is not the edge (|31| > |0|), so the edge is
  // 31 with scale -31/255 rounded... levels must still reconstruct within half a step, and value
  // k of each word sits at bits [8k, 8k+8).
  std::vector<float> w(32);
  for (int i = 0; i < 32; ++i) w[i] = static_cast<float>(i);
  std::vector<uint8_t> bytes(32 * 4);
  std::memcpy(bytes.data(), w.data(), bytes.size());
  std::vector<uint32_t> packed(8);
  std::vector<uint8_t> s(4), b(4);
  ASSERT_TRUE(affine_quantize(DType::kF32, bytes, Quantization{8, 32}, packed, s, b).ok());
  float scale, bias;
  std::memcpy(&scale, s.data(), 4);
  std::memcpy(&bias, b.data(), 4);
  EXPECT_EQ(bias, 31.0f) << "MLX: the larger-magnitude endpoint is the bias";
  EXPECT_LT(scale, 0.0f);
  for (int i = 0; i < 32; ++i) {
    const uint32_t level = (packed[i / 4] >> (8 * (i % 4))) & 0xff;
    EXPECT_NEAR(scale * level + bias, w[i], std::fabs(scale) / 2 + 1e-5) << i;
  }
  EXPECT_EQ(packed[0] & 0xff, 255u) << "w=0 is the far end: level n_bins";
}

TEST(AffineQuantPackingTest, RejectsNonFiniteValuesAndWrongSizes) {
  std::vector<uint8_t> bytes(64 * 2, 0);
  uint16_t inf = 0x7f80;
  std::memcpy(bytes.data() + 10, &inf, 2);
  std::vector<uint32_t> packed(8);
  std::vector<uint8_t> s(2), b(2);
  auto st = affine_quantize(DType::kBF16, bytes, Quantization{4, 64}, packed, s, b);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("not finite"), std::string::npos);
  std::vector<uint32_t> short_packed(7);
  EXPECT_FALSE(affine_quantize(DType::kBF16, std::vector<uint8_t>(128), Quantization{4, 64},
                               short_packed, s, b).ok());
  EXPECT_FALSE(affine_quantize(DType::kU32, bytes, Quantization{4, 64}, packed, s, b).ok());
}

TEST(AffineQuantBlockTest, QuantizedBlockExpandsBackToTheSameDequantization) {
  auto layout = testing::share(KvLayout::uniform("t", 2, 2, 64, 16, DType::kBF16));
  Block dense = testing::make_block(layout, 3, testing::Values::kKvLike);
  auto quant = dense.quantized(Quantization{4, 64});
  ASSERT_TRUE(quant.ok());
  EXPECT_LT(quant->size_bytes(), dense.size_bytes() / 3) << "4-bit is about a quarter of bf16";
  Block expanded = quant->dequantized();
  ASSERT_TRUE(expanded.dequantized_from(0).has_value());
  EXPECT_EQ(expanded.dequantized_from(0)->bits, 4);
  EXPECT_FALSE(expanded.any_quantized());
  EXPECT_TRUE(testing::same_bytes(expanded, quant->dequantized())) << "deterministic";
}

TEST(AffineQuantBlockTest, NonFiniteBlockRefusesQuantizationAndStaysDense) {
  auto layout = testing::share(KvLayout::uniform("t", 1, 2, 64, 16, DType::kBF16));
  Block dense = testing::make_block(layout, 5, testing::Values::kWithSpecials);
  auto quant = dense.quantized(Quantization{8, 64});
  EXPECT_FALSE(quant.ok());
  EXPECT_FALSE(dense.any_quantized());
}

}  // namespace
}  // namespace kvtier
