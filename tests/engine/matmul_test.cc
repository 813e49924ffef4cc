// The tiny model's matmuls against the CPU.
//
// matmul.comp sums k in order with separately rounded multiplies and adds, as the loop below does
// (the build compiles with -ffp-contract=off), so it must give the CPU's bits exactly.
// The tensor-core kernels (matmul_coopmat.glsl where the device has cooperative matrices,
// matmul_cm2.comp where it has cooperative matrix 2 with tensor loads: the H100, not lavapipe)
// round x and w to f16 (2^-11 relative each, so 2^-10 per product; the products of two f16 values
// are exact in f32) and sum in f32 in 16-wide steps: each output is within
// (2^-10 + k * 2^-23) * sum_k |x w| of the exact sum. Inputs are in [-1, 1], far inside f16's
// range.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <tuple>

#include "engine/model/matmul.h"
#include "serialize/dtype.h"
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
  // Weights that take f16 input get x's f16 copy first (to_half), as the model's producers write
  // it.
  std::vector<float> gpu_y(const MatmulWeights& weights, bool accumulate, uint32_t first,
                           uint32_t count, std::optional<MatmulTile> tile = std::nullopt) const {
    GpuBuffer gx = to_gpu(std::vector<float>(x.begin() + size_t{first} * k, x.begin() + size_t{first + count} * k));
    GpuBuffer gy = to_gpu(std::vector<float>(y0.begin() + size_t{first} * n, y0.begin() + size_t{first + count} * n));
    GpuBuffer gx16 =
        std::move(GpuBuffer::create(gpu(), size_t{count} * k * 2, MemoryKind::kDevice)).value();
    Matmul mm(gpu());
    auto batch = std::move(CommandBatch::begin(gpu())).value();
    MatmulInput in{gx.address(), 0};
    if (weights.takes_half_input()) {
      EXPECT_TRUE(mm.record_half_copy(batch, gx.address(), gx16.address(), size_t{count} * k).ok());
      batch.barrier();
      in.f16 = gx16.address();
    }
    Status st = mm.record(batch, in, weights, gy.address(), count, accumulate, tile);
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
  // Rows past a tile and k past a step (clamped tiles: zeros loaded), then whole 128 x 256 tiles.
  for (auto [rows, k, n, accumulate] :
       {std::tuple{130u, 96u, 128u, false}, std::tuple{130u, 96u, 128u, true},
        std::tuple{256u, 512u, 512u, true}}) {
    Problem p(rows, k, n);
    auto weights = std::move(MatmulWeights::upload(gpu(), p.w, p.k, p.n, true)).value();
    ASSERT_TRUE(weights.on_tensor_cores());
    std::cout << "  kernel: " << (weights.takes_half_input() ? "matmul_cm2" : "matmul_coopmat")
              << "\n";
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
// a larger one 32 at a time (matmul_coopmat), or takes a smaller tile (matmul_cm2): the same bits
// too.
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

// matmul_cm2 gives the same bits whichever tile it runs with: the launcher picks tiles by the
// launch's size, so a row's bits must not depend on the tile.
TEST(MatmulTest, TensorLoadTilesGiveTheSameBits) {
  if (!gpu().info().coopmat2_tensor_loads)
    GTEST_SKIP() << "no tensor-load matmul on " << gpu().info().name;
  Problem p(300, 1024, 512);  // a partial row tile under every tile; k over several unrolled steps
  auto weights = std::move(MatmulWeights::upload(gpu(), p.w, p.k, p.n, true)).value();
  ASSERT_TRUE(weights.takes_half_input());
  const auto first = p.gpu_y(weights, true, 0, p.rows, Matmul::tiles().front());
  // Every tile, then the launcher's large one with its row tiles walked in bands of 2 (the last
  // band partial: 300 rows are 3 row tiles of 128) and of 16 (one band, wider than the launch).
  std::vector<MatmulTile> tiles(Matmul::candidate_tiles().begin(), Matmul::candidate_tiles().end());
  for (uint32_t group : {2u, 16u}) {
    tiles.push_back(Matmul::tiles().front());
    tiles.back().group_m = group;
  }
  for (const MatmulTile& t : tiles) {
    const auto got = p.gpu_y(weights, true, 0, p.rows, t);
    EXPECT_EQ(std::memcmp(got.data(), first.data(), got.size() * 4), 0)
        << "tile " << t.rows << " x " << t.cols << ", k step " << t.k_step << ", unroll "
        << t.unroll << ", row tiles in groups of " << t.group_m;
  }
}

// The launcher's tile by launch size: with the device's SM count, the large tile whose last wave
// is fullest; without it, the largest that gives 128 workgroups. Weights past L2 are walked in
// bands of row tiles. (Which tile or order never changes a bit: the tests above.)
TEST(MatmulTest, PicksTheTileThatFillsWholeWavesOfSms) {
  const auto tiles = Matmul::tiles();
  const MatmulTile& large = tiles[0];   // 128 x 256
  const MatmulTile& medium = tiles[1];  // 128 x 128
  // q/k/v at 2048 rows: 192 large tiles are 1.45 waves of 132 SMs, 384 medium ones 2.9.
  EXPECT_EQ(Matmul::pick_tile(2048, 3072, 512, 132), medium);
  // The output projection: 128 large tiles are one wave; medium ones would be two.
  EXPECT_EQ(Matmul::pick_tile(2048, 2048, 0, 132), large);
  EXPECT_EQ(Matmul::pick_tile(8192, 3072, 512, 132), large);  // a tie keeps the larger
  // The gated launch keeps the large tile (its medium one is slow), and so does an unknown device.
  EXPECT_EQ(Matmul::pick_tile(2048, 3072, 0, 132, true), large);
  EXPECT_EQ(Matmul::pick_tile(2048, 3072, 512, 0), large);
  // Too few rows for 128 large tiles: the old rule's smaller tiles, SMs known or not.
  EXPECT_EQ(Matmul::pick_tile(16, 2048, 0, 132), Matmul::pick_tile(16, 2048, 0, 0));
  EXPECT_EQ(Matmul::pick_tile(1, 2048, 0, 132), tiles.back());
  // A few rows against many columns (the logits' rows): no tile twice as tall as the launch,
  // however many workgroups it would give. 32 x 64 for one row, 64 x 64 for 64.
  const MatmulTile& few_rows = tiles[tiles.size() - 2];
  ASSERT_EQ(few_rows.rows, 32u);
  ASSERT_EQ(few_rows.cols, 64u);
  EXPECT_EQ(Matmul::pick_tile(1, 32768, 0, 132), few_rows);
  EXPECT_EQ(Matmul::pick_tile(16, 32768, 0, 0), few_rows);
  EXPECT_EQ(Matmul::pick_tile(64, 32768, 0, 132), tiles[2]);
  EXPECT_EQ(Matmul::pick_tile(65, 32768, 0, 132).rows, 128u);
  EXPECT_EQ(Matmul::row_tile_group(2048ull * 16384 * 2), 16u);  // the 1B's gate and up: 64 MiB
  EXPECT_EQ(Matmul::row_tile_group(8192ull * 2048 * 2), 1u);    // its down projection fits L2
}

// The gated launch (SwiGLU's gate and up projections and silu_mul in one) gives the bits of what
// it replaces: two f32 launches, then silu_mul.comp's f16 rows — whatever the tile, and for a row
// launched alone as among others.
TEST(MatmulTest, GatedLaunchGivesTheBitsOfTwoLaunchesAndSiluMul) {
  if (!gpu().info().coopmat2_tensor_loads)
    GTEST_SKIP() << "no tensor-load matmul on " << gpu().info().name;
  Problem p(300, 1024, 512);
  const std::vector<float> up_w = random_floats(size_t{p.k} * p.n, 99);
  auto gate = std::move(MatmulWeights::upload(gpu(), p.w, p.k, p.n, true)).value();
  auto up = std::move(MatmulWeights::upload(gpu(), up_w, p.k, p.n, true)).value();
  GpuBuffer gx = to_gpu(p.x);
  auto device = [&](size_t bytes) {
    return std::move(GpuBuffer::create(gpu(), bytes, MemoryKind::kDevice)).value();
  };
  GpuBuffer gx16 = device(size_t{p.rows} * p.k * 2);
  GpuBuffer g32 = device(size_t{p.rows} * p.n * 4), u32 = device(size_t{p.rows} * p.n * 4);
  GpuBuffer want16 = device(size_t{p.rows} * p.n * 2), got16 = device(size_t{p.rows} * p.n * 2);
  Matmul mm(gpu());
  {
    struct SiluMulParams {
      uint64_t gate, up, out, out16;
      uint32_t pairs, pad;
    };
    auto silu = std::move(gpu().pipeline("silu_mul", {}, sizeof(SiluMulParams))).value();
    auto batch = std::move(CommandBatch::begin(gpu())).value();
    ASSERT_TRUE(
        mm.record_half_copy(batch, gx.address(), gx16.address(), size_t{p.rows} * p.k).ok());
    batch.barrier();
    const MatmulInput in{0, gx16.address()};
    ASSERT_TRUE(mm.record(batch, in, gate, g32.address(), p.rows, false).ok());
    ASSERT_TRUE(mm.record(batch, in, up, u32.address(), p.rows, false).ok());
    batch.barrier();
    const uint32_t pairs = p.rows * p.n / 2;
    batch.dispatch(*silu,
                   SiluMulParams{g32.address(), u32.address(), 0, want16.address(), pairs, 0},
                   (pairs + 255) / 256);
    ASSERT_TRUE(batch.submit_and_wait().ok());
  }
  const auto want = from_gpu<uint16_t>(want16, size_t{p.rows} * p.n);
  auto gated = [&](uint32_t first, uint32_t count, std::optional<MatmulTile> tile) {
    auto batch = std::move(CommandBatch::begin(gpu())).value();
    const MatmulInput in{0, gx16.address() + uint64_t{first} * p.k * 2};
    Status st = mm.record_gated(batch, in, gate, up, got16.address() + uint64_t{first} * p.n * 2,
                                count, tile);
    EXPECT_TRUE(st.ok()) << st.to_string();
    EXPECT_TRUE(batch.submit_and_wait().ok());
    return from_gpu<uint16_t>(got16, size_t{p.rows} * p.n);
  };
  std::vector<MatmulTile> tiles(Matmul::candidate_tiles().begin(), Matmul::candidate_tiles().end());
  tiles.push_back(Matmul::tiles().front());
  tiles.back().group_m = 2;  // row tiles in bands of 2, the last one partial
  for (const MatmulTile& t : tiles) {
    const auto got = gated(0, p.rows, t);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 2), 0)
        << "tile " << t.rows << " x " << t.cols << ", k step " << t.k_step << ", unroll "
        << t.unroll << ", row tiles in groups of " << t.group_m;
  }
  for (uint32_t r : {0u, 131u, 299u}) {
    const auto got = gated(r, 1, std::nullopt);
    EXPECT_EQ(std::memcmp(got.data() + size_t{r} * p.n, want.data() + size_t{r} * p.n, p.n * 2), 0)
        << "row " << r << " alone";
  }
  auto refused = std::move(CommandBatch::begin(gpu())).value();
  auto narrow = std::move(MatmulWeights::upload(gpu(), std::vector<float>(size_t{p.k} * 256, 0.5f),
                                                p.k, 256, true))
                    .value();
  EXPECT_EQ(
      mm.record_gated(refused, MatmulInput{0, gx16.address()}, gate, narrow, got16.address(), 1)
          .code(),
      StatusCode::kInvalidArgument);
}

// q, k and v in one launch over their weights side by side give each projection's own bits.
TEST(MatmulTest, SegmentedLaunchGivesEachProjectionsBits) {
  if (!gpu().info().coopmat2_tensor_loads)
    GTEST_SKIP() << "no tensor-load matmul on " << gpu().info().name;
  const uint32_t rows = 300, k = 512;
  const std::vector<uint32_t> widths = {256, 64,
                                        128};  // only tiles of 64 columns or fewer divide all
  Problem p(rows, k, 448);                     // x, and the joined weights [k, 448]
  Matmul mm(gpu());
  GpuBuffer gx = to_gpu(p.x);
  GpuBuffer gx16 =
      std::move(GpuBuffer::create(gpu(), size_t{rows} * k * 2, MemoryKind::kDevice)).value();
  auto joined = std::move(MatmulWeights::upload(gpu(), p.w, k, p.n, true)).value();
  std::vector<GpuBuffer> want, got;
  std::vector<MatmulSegment> segments;
  auto batch = std::move(CommandBatch::begin(gpu())).value();
  ASSERT_TRUE(mm.record_half_copy(batch, gx.address(), gx16.address(), size_t{rows} * k).ok());
  batch.barrier();
  const MatmulInput in{0, gx16.address()};
  std::vector<MatmulWeights> parts;
  for (uint32_t c0 = 0, i = 0; i < widths.size(); c0 += widths[i], ++i) {
    std::vector<float> part(size_t{k} * widths[i]);
    for (uint32_t r = 0; r < k; ++r) {
      std::copy_n(p.w.begin() + size_t{r} * p.n + c0, widths[i],
                  part.begin() + size_t{r} * widths[i]);
    }
    parts.push_back(std::move(MatmulWeights::upload(gpu(), part, k, widths[i], true)).value());
    want.push_back(testing::gpu_zeros(size_t{rows} * widths[i] * 4));
    got.push_back(testing::gpu_zeros(size_t{rows} * widths[i] * 4));
    ASSERT_TRUE(mm.record(batch, in, parts.back(), want.back().address(), rows, false).ok());
    segments.push_back({got.back().address(), widths[i]});
  }
  Status st = mm.record_segments(batch, in, joined, segments, rows);
  ASSERT_TRUE(st.ok()) << st.to_string();
  ASSERT_TRUE(batch.submit_and_wait().ok());
  for (size_t i = 0; i < widths.size(); ++i) {
    const auto a = from_gpu<float>(want[i], size_t{rows} * widths[i]);
    const auto b = from_gpu<float>(got[i], size_t{rows} * widths[i]);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "segment " << i;
  }
  auto refused = std::move(CommandBatch::begin(gpu())).value();
  const MatmulSegment short_of_n[] = {{got[0].address(), 256}, {got[1].address(), 64}};
  EXPECT_EQ(mm.record_segments(refused, in, joined, short_of_n, rows).code(),
            StatusCode::kInvalidArgument);
  const MatmulSegment odd[] = {{got[0].address(), 250}, {got[1].address(), 198}};
  EXPECT_EQ(mm.record_segments(refused, in, joined, odd, rows).code(),
            StatusCode::kInvalidArgument);
}

// The f16 copy the tensor-load kernel reads: clamped to f16's range, then rounded to nearest even,
// as serialize/dtype.h's f32_to_f16 does on the CPU (lavapipe runs it too).
TEST(MatmulTest, HalfCopyClampsThenRoundsLikeTheCpu) {
  std::vector<float> x = random_floats(4096, 5);
  for (float big : {70000.0f, -1e30f, 65519.0f, 65520.0f, 1e-8f, -3e-5f}) x.push_back(big);
  x.resize((x.size() + 3) / 4 * 4, 0.5f);
  GpuBuffer gx = to_gpu(x);
  GpuBuffer out = std::move(GpuBuffer::create(gpu(), x.size() * 2, MemoryKind::kDevice)).value();
  Matmul mm(gpu());
  auto batch = std::move(CommandBatch::begin(gpu())).value();
  ASSERT_TRUE(mm.record_half_copy(batch, gx.address(), out.address(), x.size()).ok());
  ASSERT_TRUE(batch.submit_and_wait().ok());
  const auto got = from_gpu<uint16_t>(out, x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(got[i], f32_to_f16(std::clamp(x[i], -65504.0f, 65504.0f))) << "value " << x[i];
  }
  auto refused = std::move(CommandBatch::begin(gpu())).value();
  EXPECT_EQ(mm.record_half_copy(refused, gx.address(), out.address(), 6).code(),
            StatusCode::kInvalidArgument);
}

TEST(MatmulTest, RefusesWeightsOfTheWrongShape) {
  std::vector<float> w(6 * 8);
  EXPECT_EQ(MatmulWeights::upload(gpu(), w, 6, 8, false).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MatmulWeights::upload(gpu(), w, 8, 8, false).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier
