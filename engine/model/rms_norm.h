// RmsNorm: the model's RMSNorm launches (kernels/model/rms_norm.comp): f32 rows in, normalized
// rows out as f32 and/or f16 (the tensor-core matmul's input), of every row or of listed rows
// gathered in list order (the logits' rows). A row's bits depend on that row alone, never on the
// rows beside it in the launch.
#pragma once

#include <memory>

#include "engine/vulkan/command_batch.h"

namespace kvtier {

struct RmsNormRows {
  uint64_t x = 0;       // f32 [*, dim]
  uint64_t weight = 0;  // f32 [dim]
  uint64_t out = 0;     // f32 [count, dim], or 0
  uint64_t out16 = 0;   // f16 [count, dim] (common/half_pack.glsl's rounding), or 0
  uint64_t rows = 0;    // i32 [count]: x's rows to take, in order; 0: x's first `count` rows
  uint32_t count = 0;
};

class RmsNorm {
 public:
  // Rows of `dim` values (even; rows 16-byte aligned where dim % 4 == 0).
  static Result<RmsNorm> create(VulkanContext& ctx, uint32_t dim, float eps);
  void record(CommandBatch& batch, const RmsNormRows& r) const;

  // The kernel's shape for rows of `dim`: invocations per row (a power of two) and 4-value groups
  // each holds in registers; 256 invocations per workgroup.
  struct Shape {
    uint32_t per_row, groups;
  };
  static Shape shape(uint32_t dim);
  static constexpr uint32_t kWorkgroup = 256;

 private:
  RmsNorm(std::shared_ptr<ComputePipeline> p, uint32_t dim, float eps)
      : pipeline_(std::move(p)),
        dim_(dim),
        eps_(eps),
        rows_per_group_(kWorkgroup / shape(dim).per_row) {}
  std::shared_ptr<ComputePipeline> pipeline_;
  uint32_t dim_;
  float eps_;
  uint32_t rows_per_group_;
};

}  // namespace kvtier
