// RmsNorm (kernels/model/rms_norm.comp) against a double-precision CPU norm, at every shape the
// launcher gives a row: fewer invocations per row than a subgroup (hidden 64), a subgroup (512),
// several subgroups (2048), a whole workgroup with 8 groups each (8192), and a width that is not
// a multiple of 4 (the kernel's scalar path).
#include <cmath>
#include <cstring>
#include <random>

#include <gtest/gtest.h>

#include "engine/model/rms_norm.h"
#include "serialize/dtype.h"
#include "tests/engine/engine_test_env.h"

namespace kvtier {
namespace {

using testing::from_gpu;
using testing::gpu;
using testing::to_gpu;

struct Norms {
  std::vector<float> f32;
  std::vector<uint16_t> f16;
};

Norms run(const RmsNorm& norm, const GpuBuffer& x, const GpuBuffer& w, uint64_t rows_list,
          uint32_t count, uint32_t dim) {
  GpuBuffer out = testing::gpu_zeros(size_t{count} * dim * 4);
  GpuBuffer out16 = testing::gpu_zeros(size_t{count} * dim * 2);
  auto batch = std::move(CommandBatch::begin(gpu())).value();
  norm.record(batch, RmsNormRows{x.address(), w.address(), out.address(), out16.address(),
                                 rows_list, count});
  EXPECT_TRUE(batch.submit_and_wait().ok());
  return {from_gpu<float>(out, size_t{count} * dim),
          from_gpu<uint16_t>(out16, size_t{count} * dim)};
}

// Values within 1e-5 of the double-precision norm, relative to the row's largest output: the
// kernel sums dim f32 squares in its own order (a relative error of at most ~dim * 2^-24 in the
// sum, 5e-4 at 8192, halved by the square root: far inside) and rounds three products. The f16
// rows are the f32 rows rounded (clamped to f16's range, to nearest even) bit for bit. Rows taken
// through a list, in any order and twice, are the bits of the same rows launched all together.
TEST(RmsNormTest, MatchesTheCpuAtEveryShapeAndRowsDoNotDependOnTheirLaunch) {
  const float eps = 1e-5f;
  for (uint32_t dim : {6u, 64u, 512u, 2048u, 2052u, 8192u}) {
    SCOPED_TRACE("dim " + std::to_string(dim) + ", " + std::to_string(RmsNorm::shape(dim).per_row) +
                 " invocations per row");
    const uint32_t rows = 37;
    std::mt19937 rng(dim);
    std::normal_distribution<float> d(0.0f, 3.0f);
    std::vector<float> x(size_t{rows} * dim), w(dim);
    for (float& v : x) v = d(rng);
    for (float& v : w) v = 1.0f + 0.1f * d(rng);
    x[5] = 40000.0f;  // a row whose f16 rounding clamps
    GpuBuffer gx = to_gpu(x), gw = to_gpu(w);
    auto norm = RmsNorm::create(gpu(), dim, eps);
    ASSERT_TRUE(norm.ok()) << norm.status().to_string();
    const Norms all = run(*norm, gx, gw, 0, rows, dim);
    for (uint32_t r = 0; r < rows; ++r) {
      double sum = 0;
      for (uint32_t i = 0; i < dim; ++i) sum += double(x[r * dim + i]) * x[r * dim + i];
      const double inv = 1.0 / std::sqrt(sum / dim + eps);
      double largest = 0, worst = 0;
      for (uint32_t i = 0; i < dim; ++i) {
        const double want = x[r * dim + i] * inv * w[i];
        largest = std::max(largest, std::fabs(want));
        worst = std::max(worst, std::fabs(all.f32[r * dim + i] - want));
      }
      EXPECT_LE(worst, 1e-5 * largest) << "row " << r;
    }
    for (size_t i = 0; i < all.f32.size(); ++i) {
      ASSERT_EQ(all.f16[i], f32_to_f16(std::clamp(all.f32[i], -65504.0f, 65504.0f))) << i;
    }
    const std::vector<int32_t> picked = {36, 0, 17, 36, 5};
    GpuBuffer list = to_gpu(picked);
    const Norms some = run(*norm, gx, gw, list.address(), picked.size(), dim);
    for (size_t i = 0; i < picked.size(); ++i) {
      EXPECT_EQ(std::memcmp(&some.f32[i * dim], &all.f32[size_t(picked[i]) * dim], dim * 4), 0)
          << "row " << picked[i] << " at index " << i;
      EXPECT_EQ(std::memcmp(&some.f16[i * dim], &all.f16[size_t(picked[i]) * dim], dim * 2), 0)
          << "row " << picked[i] << " at index " << i << ", f16";
    }
  }
  EXPECT_EQ(RmsNorm::create(gpu(), 7, eps).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier
