#include "bench/e2e/busy_gpu.h"

#include <algorithm>
#include <chrono>

#include "bench/e2e/e2e_support.h"

namespace kvtier::bench {

Result<std::unique_ptr<BusyGpu>> BusyGpu::create(VulkanContext& ctx, LlamaModel& model,
                                                 std::shared_ptr<const KvLayout> layout) {
  const LlamaConfig& config = model.config();
  const uint32_t blocks = static_cast<uint32_t>(std::min(16, config.max_positions / kE2eBlockSize));
  KVTIER_ASSIGN_OR_RETURN(auto pool, GpuBlockPool::create(ctx, std::move(layout), {blocks, 0}));
  KVTIER_ASSIGN_OR_RETURN(auto ids, pool->allocate(blocks));
  ForwardBatch batch =
      prompt_batch(prompt_tokens(static_cast<int>(blocks) * kE2eBlockSize, config.vocab), ids.ids);
  return std::unique_ptr<BusyGpu>(new BusyGpu(model, std::move(pool), std::move(batch)));
}

Status BusyGpu::run(double seconds) {
  if (seconds <= 0) return ok_status();
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  do {
    KVTIER_RETURN_IF_ERROR(model_.forward(batch_, *pool_).status());
  } while (std::chrono::steady_clock::now() < end);
  return ok_status();
}

}  // namespace kvtier::bench
