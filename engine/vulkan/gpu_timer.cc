#include "engine/vulkan/gpu_timer.h"

#include <cstdint>
#include <string>

namespace kvtier {

Result<std::unique_ptr<GpuTimer>> GpuTimer::create(VulkanContext& ctx) {
  if (ctx.info().timestamp_period_ns <= 0) return unavailable(ctx.info().name + " has no compute timestamps");
  VkQueryPoolCreateInfo qi{.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO};
  qi.queryType = VK_QUERY_TYPE_TIMESTAMP;
  qi.queryCount = 2;
  VkQueryPool pool = VK_NULL_HANDLE;
  if (VkResult r = vkCreateQueryPool(ctx.device(), &qi, nullptr, &pool); r != VK_SUCCESS) {
    return vk_status("vkCreateQueryPool", r);
  }
  return std::unique_ptr<GpuTimer>(new GpuTimer(ctx, pool));
}

GpuTimer::~GpuTimer() { vkDestroyQueryPool(ctx_.device(), pool_, nullptr); }

void GpuTimer::start(CommandBatch& batch) {
  // Reset here, on the host: until the batch has written both stamps, seconds() says so instead
  // of returning the previous measurement (or whatever a fresh query holds).
  vkResetQueryPool(ctx_.device(), pool_, 0, 2);
  batch.write_timestamp(pool_, 0);
}

void GpuTimer::stop(CommandBatch& batch) { batch.write_timestamp(pool_, 1); }

Result<double> GpuTimer::seconds() const {
  uint64_t stamps[2] = {0, 0};
  const VkResult r = vkGetQueryPoolResults(ctx_.device(), pool_, 0, 2, sizeof(stamps), stamps, sizeof(uint64_t),
                                           VK_QUERY_RESULT_64_BIT);
  if (r == VK_NOT_READY) return failed_precondition("GPU timer read before its batch ran");
  if (r != VK_SUCCESS) return vk_status("vkGetQueryPoolResults", r);
  const uint32_t bits = ctx_.info().timestamp_valid_bits;
  const uint64_t mask = bits >= 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1;
  const uint64_t ticks = ((stamps[1] & mask) - (stamps[0] & mask)) & mask;  // wraps within the valid bits
  return static_cast<double>(ticks) * ctx_.info().timestamp_period_ns * 1e-9;
}

}  // namespace kvtier
