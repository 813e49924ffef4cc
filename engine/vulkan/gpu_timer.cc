#include "engine/vulkan/gpu_timer.h"

#include <cstdint>
#include <string>
#include <vector>

namespace kvtier {

Result<std::unique_ptr<GpuTimer>> GpuTimer::create(VulkanContext& ctx, uint32_t marks) {
  if (marks < 2) return invalid_argument("a GPU timer needs at least two marks");
  if (ctx.info().timestamp_period_ns <= 0) return unavailable(ctx.info().name + " has no compute timestamps");
  VkQueryPoolCreateInfo qi{.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO};
  qi.queryType = VK_QUERY_TYPE_TIMESTAMP;
  qi.queryCount = marks;
  VkQueryPool pool = VK_NULL_HANDLE;
  if (VkResult r = vkCreateQueryPool(ctx.device(), &qi, nullptr, &pool); r != VK_SUCCESS) {
    return vk_status("vkCreateQueryPool", r);
  }
  return std::unique_ptr<GpuTimer>(new GpuTimer(ctx, pool, marks));
}

GpuTimer::~GpuTimer() { vkDestroyQueryPool(ctx_.device(), pool_, nullptr); }

void GpuTimer::start(CommandBatch& batch) {
  // Reset here, on the host: until the batch has written both stamps, seconds() says so instead
  // of returning the previous measurement (or whatever a fresh query holds).
  vkResetQueryPool(ctx_.device(), pool_, 0, marks_);
  batch.write_timestamp(pool_, 0);
}

void GpuTimer::stop(CommandBatch& batch) { batch.write_timestamp(pool_, 1); }

void GpuTimer::mark(CommandBatch& batch, uint32_t index) {
  if (index > 0 && index < marks_) batch.write_timestamp(pool_, index);
}

Result<double> GpuTimer::seconds() const {
  KVTIER_ASSIGN_OR_RETURN(std::vector<double> t, since_start(2));
  return t.front();
}

Result<std::vector<double>> GpuTimer::since_start(uint32_t count) const {
  if (count < 2 || count > marks_) return invalid_argument("GPU timer: marks out of range");
  std::vector<uint64_t> stamps(count, 0);
  const VkResult r = vkGetQueryPoolResults(ctx_.device(), pool_, 0, count, stamps.size() * sizeof(uint64_t),
                                           stamps.data(), sizeof(uint64_t), VK_QUERY_RESULT_64_BIT);
  if (r == VK_NOT_READY) return failed_precondition("GPU timer read before its batch ran");
  if (r != VK_SUCCESS) return vk_status("vkGetQueryPoolResults", r);
  const uint32_t bits = ctx_.info().timestamp_valid_bits;
  const uint64_t mask = bits >= 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1;
  std::vector<double> out;
  for (uint32_t i = 1; i < count; ++i) {
    const uint64_t ticks = ((stamps[i] & mask) - (stamps[0] & mask)) & mask;  // wraps within the valid bits
    out.push_back(static_cast<double>(ticks) * ctx_.info().timestamp_period_ns * 1e-9);
  }
  return out;
}

}  // namespace kvtier
