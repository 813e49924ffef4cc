// VulkanContext: kvtier's compute work on one Vulkan device (VulkanDevice: which one, and what it
// can do): two lanes of submissions — compute (the model's launches) and transfer (blocks moving
// between host and GPU) — each a queue with a timeline semaphore of its own, so an upload never
// queues behind a prefill; command pools; compiled pipelines, cached. Every test runs on Mesa's
// lavapipe (CPU Vulkan); figures come from the NVIDIA driver.
#pragma once

#include <vulkan/vulkan.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/log.h"
#include "base/status.h"
#include "engine/vulkan/vulkan_device.h"

namespace kvtier {

class ComputePipeline;

// Thread-safe: submissions are serialized by an internal mutex (the host's call, not the GPU's
// work); pipelines are cached.
class VulkanContext {
 public:
  // kUnavailable with the reason when there is no Vulkan device (or none with the features).
  static Result<std::unique_ptr<VulkanContext>> create(
      const VulkanOptions& options = VulkanOptions::from_environment());
  ~VulkanContext();
  VulkanContext(const VulkanContext&) = delete;
  VulkanContext& operator=(const VulkanContext&) = delete;

  VkDevice device() const { return device_; }
  VkPhysicalDevice physical_device() const { return dev_->physical(); }
  const DeviceInfo& info() const { return dev_->info(); }
  const VulkanOptions& options() const { return dev_->options(); }
  uint32_t compute_family() const { return dev_->compute_family(); }

  // Memory type index with all of `required` (and as many of `preferred` as possible).
  Result<uint32_t> memory_type(uint32_t type_bits, VkMemoryPropertyFlags required,
                               VkMemoryPropertyFlags preferred) const;

  // A compiled kernel with these specialization constants (constant_id -> value), cached.
  Result<std::shared_ptr<ComputePipeline>> pipeline(const std::string& kernel,
                                                    const std::vector<uint32_t>& spec_constants,
                                                    uint32_t push_constant_bytes);

  // Submits a recorded command buffer on `lane`; it signals the lane's timeline with the returned
  // value, after every earlier batch of the lane.
  Result<uint64_t> submit(VkCommandBuffer cb, Lane lane = Lane::kCompute);
  // Waits until the lane's timeline reaches `value` (its work submitted up to it is done), or
  // `timeout` passes (kUnavailable, "not reached in time"). Polls the timeline for up to
  // VulkanOptions::spin_wait_us (yielding the core meanwhile), then sleeps: in naps of
  // VulkanOptions::nap_us between looks at the timeline, or where that is 0 in the driver.
  Status wait(uint64_t value, Lane lane = Lane::kCompute,
              std::chrono::nanoseconds timeout = std::chrono::nanoseconds::max());
  // The highest value of the lane's timeline the host has waited for.
  uint64_t completed(Lane lane) const { return lanes_[index(lane)].completed.load(std::memory_order_acquire); }
  // A command buffer with a pool of its own. Vulkan wants a pool externally synchronized while
  // any of its buffers is recorded, so buffers recorded at once on different threads (a
  // background fetch's upload beside a decode step) must not share one: on NVIDIA a shared pool
  // crashed vkQueueSubmit or hung the GPU. Pools are reset and reused, not created per batch.
  struct Commands {
    VkCommandPool pool = VK_NULL_HANDLE;
    VkCommandBuffer cb = VK_NULL_HANDLE;
  };
  Result<Commands> acquire_commands(Lane lane = Lane::kCompute);
  // After the buffer is done executing (or was never submitted).
  void release_commands(Commands commands, Lane lane = Lane::kCompute);
  // Pools created so far for each lane (compute, transfer): as many as batches ever recorded at
  // once.
  std::pair<size_t, size_t> command_pools() const;
  // With options().validation, the validation layer's reports; null otherwise.
  const ValidationMessenger* validation() const { return dev_->validation(); }

 private:
  explicit VulkanContext(std::unique_ptr<VulkanDevice> dev);
  Status create_timelines();

  std::unique_ptr<VulkanDevice> dev_;  // destroyed last, after what was created on it
  VkDevice device_ = VK_NULL_HANDLE;   // dev_->device(), read on every call
  static constexpr int kDefaultSpinWaitUs = 2000;
  static constexpr int kDefaultNapUs = 50;
  std::chrono::microseconds spin_wait_{0};  // how long wait() polls before it sleeps
  std::chrono::microseconds nap_{0};        // then its naps between polls (0: the driver's wait)
  static size_t index(Lane lane) { return static_cast<size_t>(lane); }
  struct LaneState {
    VkQueue queue = VK_NULL_HANDLE;
    VkSemaphore timeline = VK_NULL_HANDLE;
    uint64_t next_value = 0;            // guarded by submit_mu_
    std::atomic<uint64_t> completed{0};  // raised by wait()
  };
  LaneState lanes_[2];  // by Lane
  std::vector<Commands> idle_commands_[2];  // by Lane
  size_t command_pools_[2] = {0, 0};

  std::mutex submit_mu_;    // guards queue submission (both lanes' queues) and next_value
  mutable std::mutex commands_mu_;  // guards idle_commands_ and command_pools_
  LogThrottle reset_failure_log_;
  std::mutex pipeline_mu_;  // guards pipelines_
  std::map<std::pair<std::string, std::vector<uint32_t>>, std::shared_ptr<ComputePipeline>> pipelines_;
};

}  // namespace kvtier
