// The tiny model's matmuls against the CPU.
//
// matmul.comp sums k in order with separately rounded multiplies and adds, as the loop below does
// (the build compiles with -ffp-contract=off), so it must give the CPU's bits exactly.
// matmul_coopmat.comp (tensor cores; runs where the device has cooperative matrices — the H100,
// not lavapipe) rounds x and w to f16 (2^-11 relative each, so 2^-10 per product; the products of
// two f16 values are exact in f32) and sums in f32 in 16-wide steps: each output is within
// (2^-10 + k * 2^-23) * sum_k |x w| of the exact sum. Inputs are in [-1, 1], far inside f16's range.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "engine/model/matmul.h"
#include "tests/engine/engine_test_env.h"

namespace kvtier {
namespace {

using testing::from_gpu;
using testing::gpu;
using testing::random_floats;
using testing::to_gpu;

struct Problem {
  uint32_t rows, k, n;
  std::vector<float> x, w, y0;

  Problem(uint32_t rows_, uint32_t k_, uint32_t n_) : rows(rows_), k(k_), n(n_) {
    x = random_floats(size_t{rows} * k, rows * 7 + k);
    w = random_floats(size_t{k} * n, k * 13 + n);
    y0 = random_floats(size_t{rows} * n, n * 3 + 1);
  }
  // The GPU's y for rows [first, first + count), starting from y0 (kept when accumulating).
  std::vector<float> gpu_y(const MatmulWeights& weights, bool accumulate, uint32_t first, uint32_t count) const {
    GpuBuffer gx = to_gpu(std::vector<float>(x.begin() + size_t{first} * k, x.begin() + size_t{first + count} * k));
    GpuBuffer gy = to_gpu(std::vector<float>(y0.begin() + size_t{first} * n, y0.begin() + size_t{first + count} * n));
    Matmul mm(gpu());
    auto batch = std::move(CommandBatch::begin(gpu())).value();
    Status st = mm.record(batch, gx.address(), weights, gy.address(), count, accumulate);
    EXPECT_TRUE(st.ok()) << st.to_string();
    EXPECT_TRUE(batch.submit_and_wait().ok());
    return from_gpu<float>(gy, size_t{count} * n);
  }
};

TEST(MatmulTest, ScalarKernelGivesTheCpusBits) {
  for (bool accumulate : {false, true}) {
    Problem p(37, 64, 128);
    auto weights = std::move(MatmulWeights::upload(gpu(), p.w, p.k, p.n, false)).value();
    ASSERT_FALSE(weights.on_tensor_cores());
    const auto got = p.gpu_y(weights, accumulate, 0, p.rows);
    std::vector<float> want(got.size());
    for (uint32_t r = 0; r < p.rows; ++r) {
      for (uint32_t c = 0; c < p.n; ++c) {
        float acc = 0;
        for (uint32_t i = 0; i < p.k; ++i) acc = acc + p.x[size_t{r} * p.k + i] * p.w[size_t{i} * p.n + c];
        want[size_t{r} * p.n + c] = accumulate ? p.y0[size_t{r} * p.n + c] + acc : acc;
      }
    }
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0) << "accumulate " << accumulate;
  }
}

TEST(MatmulTest, TensorCoreKernelStaysWithinItsRoundingBound) {
  if (!gpu().info().coopmat_f16) GTEST_SKIP() << "no cooperative matrices on " << gpu().info().name;
  for (bool accumulate : {false, true}) {
    Problem p(130, 96, 128);  // rows past a 64-row tile, k over three 32-wide steps
    auto weights = std::move(MatmulWeights::upload(gpu(), p.w, p.k, p.n, true)).value();
    ASSERT_TRUE(weights.on_tensor_cores());
    const auto got = p.gpu_y(weights, accumulate, 0, p.rows);
    double worst = 0;
    for (uint32_t r = 0; r < p.rows; ++r) {
      for (uint32_t c = 0; c < p.n; ++c) {
        double exact = 0, magnitude = 0;
        for (uint32_t i = 0; i < p.k; ++i) {
          const double prod = double(p.x[size_t{r} * p.k + i]) * p.w[size_t{i} * p.n + c];
          exact += prod;
          magnitude += std::fabs(prod);
        }
        const double y0 = accumulate ? p.y0[size_t{r} * p.n + c] : 0.0;
        // The final add of y0 rounds once more (2^-24 of the result).
        const double bound = (0x1p-10 + p.k * 0x1p-23) * magnitude + 0x1p-24 * std::fabs(y0 + exact) + 1e-30;
        const double err = std::fabs(got[size_t{r} * p.n + c] - (y0 + exact));
        ASSERT_LE(err, bound) << "row " << r << ", column " << c << ", accumulate " << accumulate;
        worst = std::max(worst, err / bound);
      }
    }
    std::cout << "  worst error / bound: " << worst << "\n";
  }
}

// A row's values are the same bits computed alone, in the middle of a batch, or as the last row
// of a partial tile. On tensor cores a launch of one row tile steps through k 128 at a time and
// a larger one 32 at a time: the same bits too.
TEST(MatmulTest, RowsAreTheSameBitsWhateverShareTheirLaunch) {
  for (bool tensor_cores : {false, true}) {
    if (tensor_cores && !gpu().info().coopmat_f16) continue;
    Problem p(100, 256, 128);
    auto weights = std::move(MatmulWeights::upload(gpu(), p.w, p.k, p.n, tensor_cores)).value();
    const auto all = p.gpu_y(weights, true, 0, p.rows);
    for (uint32_t r : {0u, 63u, 64u, 99u}) {
      const auto alone = p.gpu_y(weights, true, r, 1);
      EXPECT_EQ(std::memcmp(alone.data(), all.data() + size_t{r} * p.n, p.n * 4), 0)
          << "row " << r << (tensor_cores ? ", tensor cores" : ", scalar");
    }
  }
}

TEST(MatmulTest, RefusesWeightsOfTheWrongShape) {
  std::vector<float> w(6 * 8);
  EXPECT_EQ(MatmulWeights::upload(gpu(), w, 6, 8, false).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MatmulWeights::upload(gpu(), w, 8, 8, false).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier
