// CommandBatch: records dispatches, copies and barriers into one command buffer and submits them
// as one unit of work (signalling the context's timeline semaphore). Batching many blocks' copies
// into one submission is what makes moving blocks between GPU and host cheap.
#pragma once

#include <vulkan/vulkan.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "base/status.h"
#include "engine/vulkan/compute_pipeline.h"
#include "engine/vulkan/gpu_buffer.h"
#include "engine/vulkan/vulkan_context.h"

namespace kvtier {

// Not thread-safe; movable. Destroying an unsubmitted batch discards it; a submitted one is
// waited for before its command pool goes back to the context.
class CommandBatch {
 public:
  static Result<CommandBatch> begin(VulkanContext& ctx, Lane lane = Lane::kCompute);
  ~CommandBatch();
  CommandBatch(CommandBatch&& o) noexcept;
  CommandBatch& operator=(CommandBatch&&) = delete;
  CommandBatch(const CommandBatch&) = delete;

  void dispatch(const ComputePipeline& p, const void* push, uint32_t push_bytes, uint32_t gx,
                uint32_t gy = 1, uint32_t gz = 1);
  template <typename Params>
  void dispatch(const ComputePipeline& p, const Params& params, uint32_t gx, uint32_t gy = 1,
                uint32_t gz = 1) {
    dispatch(p, &params, sizeof(Params), gx, gy, gz);
  }
  void copy(const GpuBuffer& src, uint64_t src_offset, const GpuBuffer& dst, uint64_t dst_offset,
            uint64_t bytes);
  // Many regions between two buffers in one command (imported host memory has no GpuBuffer).
  void copy_regions(VkBuffer src, VkBuffer dst, std::span<const VkBufferCopy> regions);
  void fill(const GpuBuffer& dst, uint64_t offset, uint64_t bytes, uint32_t value);
  // Makes every earlier write (a dispatch's or a copy's) visible to every later dispatch and copy
  // of this batch. submit() ends the batch with a barrier that also reaches the host and the
  // batches after it on the queue.
  void barrier();
  // Writes timestamp query `query` of `pool` (GpuTimer) once every command recorded before it
  // has completed.
  void write_timestamp(VkQueryPool pool, uint32_t query);
  // Keeps what recorded commands use (a launcher's scratch buffers, which the launcher may replace
  // or drop before the batch runs) alive until the batch is done: released after the destructor's
  // wait, or when a batch is dropped unsubmitted.
  void retain(std::shared_ptr<void> keep);

  Result<uint64_t> submit();
  Status submit_and_wait();

 private:
  // Every stage and kind of memory, the host's included: what submit() ends a batch with.
  void full_barrier();
  CommandBatch(VulkanContext& ctx, VulkanContext::Commands commands, Lane lane)
      : ctx_(&ctx), pool_(commands.pool), cb_(commands.cb), lane_(lane) {}
  VulkanContext* ctx_;
  VkCommandPool pool_;  // this batch's alone (see VulkanContext::acquire_commands)
  VkCommandBuffer cb_;
  Lane lane_;
  uint64_t submitted_ = 0;  // the lane's timeline value, 0 until submitted
  std::vector<std::shared_ptr<void>> retained_;  // released after the wait in the destructor
};

}  // namespace kvtier
