#include "engine/vulkan/command_batch.h"

#include <utility>

#include "base/log.h"

namespace kvtier {

Result<CommandBatch> CommandBatch::begin(VulkanContext& ctx, Lane lane) {
  KVTIER_ASSIGN_OR_RETURN(VulkanContext::Commands c, ctx.acquire_commands(lane));
  VkCommandBufferBeginInfo bi{.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  if (VkResult r = vkBeginCommandBuffer(c.cb, &bi); r != VK_SUCCESS) {
    ctx.release_commands(c, lane);
    return vk_status("vkBeginCommandBuffer", r);
  }
  return CommandBatch(ctx, c, lane);
}

CommandBatch::CommandBatch(CommandBatch&& o) noexcept
    : ctx_(o.ctx_),
      pool_(std::exchange(o.pool_, VK_NULL_HANDLE)),
      cb_(std::exchange(o.cb_, VK_NULL_HANDLE)),
      lane_(o.lane_),
      submitted_(std::exchange(o.submitted_, 0)), retained_(std::move(o.retained_)) {}

CommandBatch::~CommandBatch() {
  if (cb_ == VK_NULL_HANDLE) return;
  if (submitted_) {
    Status st = ctx_->wait(submitted_, lane_);
    if (!st.ok()) spdlog::error("vulkan: waiting for a batch before freeing it: {}", st.to_string());
  }
  ctx_->release_commands({pool_, cb_}, lane_);
}

void CommandBatch::dispatch(const ComputePipeline& p, const void* push, uint32_t push_bytes,
                            uint32_t gx, uint32_t gy, uint32_t gz) {
  vkCmdBindPipeline(cb_, VK_PIPELINE_BIND_POINT_COMPUTE, p.handle());
  if (push_bytes) vkCmdPushConstants(cb_, p.layout(), VK_SHADER_STAGE_COMPUTE_BIT, 0, push_bytes, push);
  vkCmdDispatch(cb_, gx, gy, gz);
}

void CommandBatch::copy(const GpuBuffer& src, uint64_t src_offset, const GpuBuffer& dst,
                        uint64_t dst_offset, uint64_t bytes) {
  VkBufferCopy region{src_offset, dst_offset, bytes};
  vkCmdCopyBuffer(cb_, src.handle(), dst.handle(), 1, &region);
}

void CommandBatch::copy_regions(VkBuffer src, VkBuffer dst, std::span<const VkBufferCopy> regions) {
  if (regions.empty()) return;
  vkCmdCopyBuffer(cb_, src, dst, static_cast<uint32_t>(regions.size()), regions.data());
}

void CommandBatch::fill(const GpuBuffer& dst, uint64_t offset, uint64_t bytes, uint32_t value) {
  vkCmdFillBuffer(cb_, dst.handle(), offset, bytes, value);
}

void CommandBatch::retain(std::shared_ptr<void> keep) {
  if (keep) retained_.push_back(std::move(keep));
}

void CommandBatch::barrier() {
  // Only the stages and accesses a batch records: dispatches and copies. Every stage and every
  // kind of memory (the full barrier submit() ends with) made each barrier cost the NVIDIA driver
  // far more: H200, the tiny model's 16-row forward of a GPU hit (~40 launches, a barrier after
  // most) 0.458 / 0.464 -> 0.363 / 0.363 ms of GPU time, its uncached 8192-token prefill 2.92 ->
  // 2.81; all stages without the host's part measured as the full barrier (docs/benchmarks.md).
  VkMemoryBarrier mb{};
  mb.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER;
  mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT |
                     VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  const VkPipelineStageFlags stages =
      VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;
  vkCmdPipelineBarrier(cb_, stages, stages, 0, 1, &mb, 0, nullptr, 0, nullptr);
}

void CommandBatch::full_barrier() {
  VkMemoryBarrier mb{};
  mb.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER;
  mb.srcAccessMask = VK_ACCESS_MEMORY_WRITE_BIT;
  mb.dstAccessMask = VK_ACCESS_MEMORY_READ_BIT | VK_ACCESS_MEMORY_WRITE_BIT | VK_ACCESS_HOST_READ_BIT;
  vkCmdPipelineBarrier(cb_, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT,
                       VK_PIPELINE_STAGE_ALL_COMMANDS_BIT | VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &mb, 0,
                       nullptr, 0, nullptr);
}

void CommandBatch::write_timestamp(VkQueryPool pool, uint32_t query) {
  vkCmdWriteTimestamp(cb_, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, pool, query);
}

Result<uint64_t> CommandBatch::submit() {
  if (submitted_) return failed_precondition("command batch submitted twice");
  // Results are visible to the host once the timeline reaches this batch, and to every batch
  // submitted after it on the queue.
  full_barrier();
  if (VkResult r = vkEndCommandBuffer(cb_); r != VK_SUCCESS) return vk_status("vkEndCommandBuffer", r);
  KVTIER_ASSIGN_OR_RETURN(submitted_, ctx_->submit(cb_, lane_));
  return submitted_;
}

Status CommandBatch::submit_and_wait() {
  KVTIER_ASSIGN_OR_RETURN(uint64_t v, submit());
  return ctx_->wait(v, lane_);
}

}  // namespace kvtier
