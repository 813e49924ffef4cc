#include "engine/model/rms_norm.h"

#include <algorithm>

namespace kvtier {

namespace {

struct Params {
  uint64_t x, weight, out, out16, rows;
  uint32_t count, dim;
  float eps, pad;
};

}  // namespace

RmsNorm::Shape RmsNorm::shape(uint32_t dim) {
  // Up to 4 groups of 4 values per invocation (16 registers), as many invocations as that takes
  // up to the workgroup: hidden 2048 gets 128 invocations per row, hidden 512 a subgroup's 32 and
  // 8 rows per workgroup. The 1B's 33 norms at 2048 tokens (H200, e2e_bench --profile-stages):
  // a workgroup per row reading x twice 0.44 ms, a subgroup per row 0.49 (too few loads in
  // flight), this 0.37; the tiny model's at 32768 tokens 0.34 -> 0.28.
  uint32_t per_row = 1;
  while (per_row < kWorkgroup && per_row * 16 < dim) per_row *= 2;
  return {per_row, std::max<uint32_t>(1, (dim / 4 + per_row - 1) / per_row)};
}

Result<RmsNorm> RmsNorm::create(VulkanContext& ctx, uint32_t dim, float eps) {
  if (dim == 0 || dim % 2 != 0) return invalid_argument("rms_norm: rows of an even, nonzero width");
  if (kWorkgroup > ctx.info().max_workgroup_invocations)
    return unavailable("rms_norm: the device's workgroups are smaller than 256 invocations");
  const Shape s = shape(dim);
  KVTIER_ASSIGN_OR_RETURN(
      auto p, ctx.pipeline("rms_norm", {kWorkgroup, s.per_row, s.groups}, sizeof(Params)));
  return RmsNorm(std::move(p), dim, eps);
}

void RmsNorm::record(CommandBatch& batch, const RmsNormRows& r) const {
  if (r.count == 0) return;
  batch.dispatch(*pipeline_, Params{r.x, r.weight, r.out, r.out16, r.rows, r.count, dim_, eps_, 0},
                 (r.count + rows_per_group_ - 1) / rows_per_group_);
}

}  // namespace kvtier
