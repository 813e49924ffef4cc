#include "engine/model/matmul.h"

#include <algorithm>
#include <array>
#include <numeric>
#include <vector>

#include "serialize/dtype.h"

namespace kvtier {

namespace {

struct MatmulParams {
  uint64_t x, w, y;
  uint32_t rows, k, n, accumulate;
};

struct HalfCopyParams {
  uint64_t x, out;
  uint32_t quads, pad;
};

// Largest first. 128 x 256 is ggml-vulkan's large tile for cooperative matrix 2 (and NVIDIA's
// sample's); the smaller ones keep the SMs busy where a launch has few large tiles, and the last
// two are for a few rows (a decode step, the logits' row, a short suffix): 32 x 64 where the
// columns alone give every SM work, 32 x 32 with deeper steps (twice the workgroups) where they
// do not. Eight k steps per loop iteration: 245 -> 266 TFLOP/s at the 1B down projection over
// 8192 rows (H200; docs/benchmarks.md).
constexpr std::array<MatmulTile, 9> kCandidates{{
    {256, 128, 256, 64, 8},
    {256, 128, 128, 64, 8},
    {128, 64, 64, 64, 4},
    {128, 32, 64, 64, 4},
    {128, 32, 32, 128, 4},
    // Not the launcher's: other shapes of the same work, for matmul_bench --all-tiles.
    {256, 128, 256, 64, 4},
    {256, 128, 256, 32, 8},
    {256, 256, 128, 64, 4},
    {128, 128, 128, 64, 4},
}};
constexpr std::span<const MatmulTile> kTiles(kCandidates.data(), 5);

// A launch with fewer workgroups than this leaves some of an H100's 132 SMs idle.
constexpr uint64_t kEnoughWorkgroups = 128;
constexpr uint64_t kGroupedWeightBytes = 48ull << 20;
constexpr uint32_t kRowTileGroup = 16;

uint64_t workgroups(const MatmulTile& t, uint32_t rows, uint32_t n) {
  return uint64_t{(rows + t.rows - 1) / t.rows} * ((n + t.cols - 1) / t.cols);
}

}  // namespace

// matmul_cm2's push constants: w_up only where GATED.
struct Matmul::TensorLoadParams {
  uint64_t x, w, y, w_up, y2, y3;
  uint32_t rows, k, n, accumulate, n1, n2;
};

Result<MatmulWeights> MatmulWeights::upload(VulkanContext& ctx, std::span<const float> values, uint32_t k,
                                            uint32_t n, bool tensor_cores) {
  if (k == 0 || n == 0 || k % 4 != 0 || n % 4 != 0 || values.size() != uint64_t{k} * n) {
    return invalid_argument("matmul: weights must be [k, n] with k and n multiples of 4");
  }
  MatmulWeights w;
  w.k = k;
  w.n = n;
  // One copy on the GPU, the one its kernel reads: a 1B model's f32 weights are 4.5 GiB that the
  // tensor-core kernels never touch.
  const bool shape_fits = tensor_cores && k % 32 == 0 && n % 64 == 0;
  const bool transposed = shape_fits && ctx.info().coopmat2_tensor_loads;
  if (!transposed && !(shape_fits && ctx.info().coopmat_f16)) {
    KVTIER_ASSIGN_OR_RETURN(w.f32, upload_new<float>(ctx, values));
    return w;
  }
  auto half = [&](size_t i) { return f32_to_f16(std::clamp(values[i], -65504.0f, 65504.0f)); };
  std::vector<uint16_t> halves(values.size());
  if (transposed) {
    for (uint32_t c = 0; c < n; ++c) {
      for (uint32_t i = 0; i < k; ++i) halves[size_t{c} * k + i] = half(size_t{i} * n + c);
    }
    KVTIER_ASSIGN_OR_RETURN(w.f16t, upload_new<uint16_t>(ctx, std::span<const uint16_t>(halves)));
  } else {
    for (size_t i = 0; i < values.size(); ++i) halves[i] = half(i);
    KVTIER_ASSIGN_OR_RETURN(w.f16, upload_new<uint16_t>(ctx, std::span<const uint16_t>(halves)));
  }
  return w;
}

std::span<const MatmulTile> Matmul::tiles() { return kTiles; }
std::span<const MatmulTile> Matmul::candidate_tiles() { return kCandidates; }

MatmulTile Matmul::pick_tile(uint32_t rows, uint32_t n, uint32_t col_multiple, uint32_t sms,
                             bool gated) {
  auto fits = [&](const MatmulTile& t) { return col_multiple == 0 || col_multiple % t.cols == 0; };
  // Where the device says how many SMs it has and both large tiles fill them: the one whose last
  // wave is fullest, by outputs per SM (a workgroup fills an SM). The q/k/v launch of 2048 rows
  // (3072 columns) is 192 tiles of 128 x 256 — 1.45 waves of an H200's 132 SMs — or 384 of
  // 128 x 128, 2.9 waves: 2.29 -> 1.96-1.98 ms over 16 layers (H200, e2e_bench --profile-stages).
  // Equal cost keeps the larger tile. Not for the gated launch: its 128 x 128 tile ran 1.4x slower.
  const MatmulTile& large = kTiles[0];
  const MatmulTile& medium = kTiles[1];
  const MatmulTile& smallest = kTiles.back();
  // A tile at least twice as tall as the launch (see below); the smallest never counts as one.
  auto tall = [&](const MatmulTile& t) { return t.rows >= 2 * rows && t.rows > smallest.rows; };
  if (sms > 0 && !gated && fits(large) && fits(medium) && !tall(large) &&
      workgroups(large, rows, n) >= kEnoughWorkgroups) {
    auto cost = [&](const MatmulTile& t) {
      return (workgroups(t, rows, n) + sms - 1) / sms * uint64_t{t.rows} * t.cols;
    };
    return cost(medium) < cost(large) ? medium : large;
  }
  // Otherwise the largest tile that still gives every SM work, leaving out tiles at least twice
  // as tall as the launch (rows of zeros, loaded and multiplied, with fewer workgroups to hide each
  // step's wait: the 1B's logits, one row -> 32768 columns, took 0.220 ms on 128 x 256 tiles and
  // 0.087 on 32 x 64, H200, matmul_bench); below that, the smallest that covers the rows (a decode
  // step's single row loads zeros for the rest of its tile, not memory). Only tiles whose columns
  // divide col_multiple, where one is given (the last one's always do).
  for (const MatmulTile& t : kTiles.first(kTiles.size() - 1)) {
    if (!tall(t) && fits(t) && workgroups(t, rows, n) >= kEnoughWorkgroups) return t;
  }
  const MatmulTile& covering = kTiles[2];  // 64 x 64
  if (rows > smallest.rows && fits(covering)) return covering;
  return smallest;
}

uint32_t Matmul::row_tile_group(uint64_t weight_bytes) {
  // Weights larger than L2 (50 MiB on the H100 and H200) are streamed from memory once per row
  // tile unless row tiles share them. The 1B's gated gate/up launch (64 MiB) over 16 layers at
  // 2048 / 8192 rows (H200, e2e_bench --profile-stages): row tile by row tile 8.71 / 33.8 ms,
  // groups of 8 8.29 / 31.1, of 16 8.11 / 29.5. Its down projection (32 MiB) fits L2 and gained
  // nothing.
  return weight_bytes > kGroupedWeightBytes ? kRowTileGroup : 1;
}

Status Matmul::record_segments(CommandBatch& batch, MatmulInput x, const MatmulWeights& w,
                               std::span<const MatmulSegment> segments, uint32_t rows) {
  if (w.kernel() != MatmulKernel::kTensorLoads) {
    return invalid_argument("matmul: segmented outputs need weights on the tensor-load kernel");
  }
  if (segments.empty() || segments.size() > 3)
    return invalid_argument("matmul: one to three output segments");
  uint32_t total = 0, multiple = 0;
  for (const MatmulSegment& s : segments) {
    if (s.cols == 0 || s.cols % kTiles.back().cols != 0) {
      return invalid_argument("matmul: a segment's width must be a multiple of " +
                              std::to_string(kTiles.back().cols));
    }
    total += s.cols;
    multiple = std::gcd(multiple, s.cols);
  }
  if (total != w.n)
    return invalid_argument("matmul: the segments' widths must add up to the weights' columns");
  if (x.f16 == 0)
    return invalid_argument("matmul: these weights take f16 input rows (MatmulInput::f16)");
  if (rows == 0) return ok_status();
  auto seg = [&](size_t i) { return i < segments.size() ? segments[i] : MatmulSegment{0, 0}; };
  const uint32_t n1 = seg(0).cols, n2 = n1 + seg(1).cols;
  return record_tensor_loads(batch,
                             TensorLoadParams{x.f16, w.f16t.address(), seg(0).y, 0, seg(1).y,
                                              seg(2).y, rows, w.k, w.n, 0, n1, n2},
                             pick_tile(rows, w.n, multiple, ctx_.info().sm_count), false);
}

Status Matmul::record(CommandBatch& batch, MatmulInput x, const MatmulWeights& w, uint64_t y,
                      uint32_t rows, bool accumulate, std::optional<MatmulTile> tile) {
  if (rows == 0) return ok_status();
  switch (w.kernel()) {
    case MatmulKernel::kTensorLoads:
      if (x.f16 == 0)
        return invalid_argument("matmul: these weights take f16 input rows (MatmulInput::f16)");
      return record_tensor_loads(batch,
                                 TensorLoadParams{x.f16, w.f16t.address(), y, 0, 0, 0, rows, w.k,
                                                  w.n, accumulate ? 1u : 0u, w.n, w.n},
                                 tile.value_or(pick_tile(rows, w.n, 0, ctx_.info().sm_count)),
                                 false);
    case MatmulKernel::kCoopmat: {
      // One row tile (a decode step, a short suffix after a restored prefix): only n / 64
      // workgroups, each waiting on memory once per k step, so deeper steps. Same bits (see the
      // kernel). Shallower steps left a 16-row forward waiting on memory whatever its context.
      const bool deep = rows <= 64 && w.k % kDeepStep == 0;
      auto& pipeline = deep ? coopmat_deep_ : coopmat_;
      if (!pipeline) {
        KVTIER_ASSIGN_OR_RETURN(
            pipeline, ctx_.pipeline(ctx_.info().coopmat_khr ? "matmul_khr" : "matmul_coopmat",
                                    {deep ? kDeepStep : 32u}, sizeof(MatmulParams)));
      }
      const MatmulParams p{x.f32, w.f16.address(), y, rows, w.k, w.n, accumulate ? 1u : 0u};
      batch.dispatch(*pipeline, p, w.n / 64, (rows + 63) / 64);  // 64 x 64 outputs per workgroup
      return ok_status();
    }
    case MatmulKernel::kScalar:
      break;
  }
  if (!scalar_) {
    KVTIER_ASSIGN_OR_RETURN(scalar_, ctx_.pipeline("matmul", {}, sizeof(MatmulParams)));
  }
  const MatmulParams p{x.f32, w.f32.address(), y, rows, w.k, w.n, accumulate ? 1u : 0u};
  batch.dispatch(*scalar_, p, (w.n + 255) / 256, (rows + 3) / 4);  // 64 x 4 columns by 4 rows
  return ok_status();
}

Status Matmul::record_gated(CommandBatch& batch, MatmulInput x, const MatmulWeights& gate,
                            const MatmulWeights& up, uint64_t y16, uint32_t rows,
                            std::optional<MatmulTile> tile) {
  if (gate.kernel() != MatmulKernel::kTensorLoads || up.kernel() != MatmulKernel::kTensorLoads) {
    return invalid_argument("matmul: a gated launch needs both weights on the tensor-load kernel");
  }
  if (gate.k != up.k || gate.n != up.n || gate.n % 8 != 0) {
    return invalid_argument("matmul: gate and up weights of different shapes");
  }
  if (x.f16 == 0)
    return invalid_argument("matmul: these weights take f16 input rows (MatmulInput::f16)");
  if (rows == 0) return ok_status();
  // A gated tile's columns are half gate, half up: as many workgroups as an ungated launch twice
  // as wide.
  return record_tensor_loads(
      batch,
      TensorLoadParams{x.f16, gate.f16t.address(), y16, up.f16t.address(), 0, 0, rows, gate.k,
                       gate.n, 0, gate.n, gate.n},
      tile.value_or(pick_tile(rows, 2 * gate.n, 0, ctx_.info().sm_count, true)), true);
}

Status Matmul::record_tensor_loads(CommandBatch& batch, const TensorLoadParams& p, MatmulTile tile,
                                   bool gated) {
  if (tile.threads > ctx_.info().coopmat2_max_workgroup) {
    return invalid_argument("matmul: a tile of " + std::to_string(tile.threads) +
                            " invocations is past the device's cooperative-matrix workgroup limit");
  }
  const uint32_t group_m =
      tile.group_m ? tile.group_m : row_tile_group(uint64_t{p.n} * p.k * 2 * (gated ? 2 : 1));
  auto it =
      std::find_if(tensor_loads_.begin(), tensor_loads_.end(), [&](const TensorLoadPipeline& e) {
        return e.tile == tile && e.gated == gated && e.group_m == group_m;
      });
  if (it == tensor_loads_.end()) {
    KVTIER_ASSIGN_OR_RETURN(
        auto pipeline, ctx_.pipeline("matmul_cm2",
                                     {tile.threads, tile.rows, tile.cols, tile.k_step, tile.unroll,
                                      gated ? 1u : 0u, group_m},
                                     sizeof(TensorLoadParams)));
    it = tensor_loads_.insert(tensor_loads_.end(),
                              TensorLoadPipeline{tile, gated, group_m, std::move(pipeline)});
  }
  const uint32_t cols = gated ? tile.cols / 2 : tile.cols;
  batch.dispatch(*it->pipeline, p, (p.n + cols - 1) / cols, (p.rows + tile.rows - 1) / tile.rows);
  return ok_status();
}

Status Matmul::record_half_copy(CommandBatch& batch, uint64_t x, uint64_t out, uint64_t count) {
  if (count % 4 != 0 || count / 4 > 0xffffffffull)
    return invalid_argument("matmul: half copy of a bad count");
  if (count == 0) return ok_status();
  if (!half_copy_) {
    KVTIER_ASSIGN_OR_RETURN(half_copy_, ctx_.pipeline("to_half", {}, sizeof(HalfCopyParams)));
  }
  const uint32_t quads = static_cast<uint32_t>(count / 4);
  batch.dispatch(*half_copy_, HalfCopyParams{x, out, quads, 0}, (quads + 255) / 256);
  return ok_status();
}

}  // namespace kvtier
