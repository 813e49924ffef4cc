// GpuTimer: the GPU's own clock around a stretch of recorded commands (two timestamp queries), for
// benchmarks whose figure is the GPU time of their launches: timing the host's submit-and-wait
// also counts the submission and the wake-up, which a few launches per submission do not amortize.
#pragma once

#include <vulkan/vulkan.h>

#include <memory>
#include <vector>

#include "base/status.h"
#include "engine/vulkan/command_batch.h"
#include "engine/vulkan/vulkan_context.h"

namespace kvtier {

// Not thread-safe. One measurement at a time: start and stop in one batch, read after it is done;
// start again only once that batch is done.
class GpuTimer {
 public:
  // Unavailable when the device's compute queue has no timestamps. `marks`: timestamps it holds
  // (start is mark 0, stop mark 1; mark() writes others, for a timeline of stages).
  static Result<std::unique_ptr<GpuTimer>> create(VulkanContext& ctx, uint32_t marks = 2);
  ~GpuTimer();
  GpuTimer(const GpuTimer&) = delete;
  GpuTimer& operator=(const GpuTimer&) = delete;

  void start(CommandBatch& batch);
  void stop(CommandBatch& batch);
  // Writes mark `index` (1 .. marks - 1) once every command recorded before it has completed.
  void mark(CommandBatch& batch, uint32_t index);
  // Seconds between start and stop, once the batch holding them is done; an error when they were
  // never recorded or their batch has not run (or was dropped).
  Result<double> seconds() const;
  // Seconds from mark 0 to each of marks 1 .. count - 1, once the batch holding them is done.
  Result<std::vector<double>> since_start(uint32_t count) const;

 private:
  GpuTimer(VulkanContext& ctx, VkQueryPool pool, uint32_t marks) : ctx_(ctx), pool_(pool), marks_(marks) {}
  VulkanContext& ctx_;
  VkQueryPool pool_;
  uint32_t marks_;
};

}  // namespace kvtier
