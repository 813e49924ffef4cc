#include "engine/model/matmul.h"

#include <algorithm>
#include <vector>

#include "serialize/dtype.h"

namespace kvtier {

namespace {

struct MatmulParams {
  uint64_t x, w, y;
  uint32_t rows, k, n, accumulate;
};

}  // namespace

Result<MatmulWeights> MatmulWeights::upload(VulkanContext& ctx, std::span<const float> values, uint32_t k,
                                            uint32_t n, bool tensor_cores) {
  if (k == 0 || n == 0 || k % 4 != 0 || n % 4 != 0 || values.size() != uint64_t{k} * n) {
    return invalid_argument("matmul: weights must be [k, n] with k and n multiples of 4");
  }
  MatmulWeights w;
  w.k = k;
  w.n = n;
  KVTIER_ASSIGN_OR_RETURN(w.f32, upload_new<float>(ctx, values));
  if (tensor_cores && ctx.info().coopmat_f16 && k % 32 == 0 && n % 64 == 0) {
    std::vector<uint16_t> halves(values.size());
    for (size_t i = 0; i < values.size(); ++i) halves[i] = f32_to_f16(std::clamp(values[i], -65504.0f, 65504.0f));
    KVTIER_ASSIGN_OR_RETURN(w.f16, upload_new<uint16_t>(ctx, std::span<const uint16_t>(halves)));
  }
  return w;
}

Status Matmul::record(CommandBatch& batch, uint64_t x, const MatmulWeights& w, uint64_t y, uint32_t rows,
                      bool accumulate) {
  if (rows == 0) return ok_status();
  const MatmulParams p{x, w.on_tensor_cores() ? w.f16.address() : w.f32.address(), y, rows, w.k, w.n,
                       accumulate ? 1u : 0u};
  if (w.on_tensor_cores()) {
    // One row tile (a decode step, a short suffix after a restored prefix): only n / 64
    // workgroups, each waiting on memory once per k step, so deeper steps. Same bits (see the
    // kernel). Shallower steps left a 16-row forward waiting on memory whatever its context;
    // larger tiles for many rows were no faster and leave SMs idle on short prompts, so there is
    // one shape (docs/benchmarks.md, "512-key splits", for the figures).
    const bool deep = rows <= 64 && w.k % kDeepStep == 0;
    auto& pipeline = deep ? coopmat_deep_ : coopmat_;
    if (!pipeline) {
      KVTIER_ASSIGN_OR_RETURN(pipeline, ctx_.pipeline(ctx_.info().coopmat_khr ? "matmul_khr" : "matmul_coopmat",
                                                      {deep ? kDeepStep : 32u}, sizeof(MatmulParams)));
    }
    batch.dispatch(*pipeline, p, w.n / 64, (rows + 63) / 64);  // 64 x 64 outputs per workgroup
  } else {
    if (!scalar_) {
      KVTIER_ASSIGN_OR_RETURN(scalar_, ctx_.pipeline("matmul", {}, sizeof(MatmulParams)));
    }
    batch.dispatch(*scalar_, p, (w.n + 255) / 256, (rows + 3) / 4);  // 64 x 4 columns by 4 rows
  }
  return ok_status();
}

}  // namespace kvtier
