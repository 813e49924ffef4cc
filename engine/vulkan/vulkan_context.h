// VulkanContext: one Vulkan device set up for kvtier's compute work — instance, physical device
// (a discrete GPU first, then any; KVTIER_VK_DEVICE picks one by index or by a substring of its
// name), and two lanes of submissions — compute (the model's launches) and transfer (blocks moving
// between host and GPU) — each a queue with a timeline semaphore of its own, so an upload never
// queues behind a prefill. Every test runs on Mesa's lavapipe (CPU Vulkan);
// figures come from the NVIDIA driver.
//
// Required device features: bufferDeviceAddress and shaderInt64 (kernels address buffers by
// 64-bit pointers), timelineSemaphore, and subgroup shuffles in compute shaders. Optional ones
// (host memory import, cooperative matrices, pipeline statistics) are enabled where present.
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
#include "engine/vulkan/validation_messenger.h"

namespace kvtier {

class ComputePipeline;

// Where a batch is submitted. Each lane executes its batches in submission order; the two lanes
// are ordered only where the host orders them: a batch on one lane waits for everything the
// host has seen complete on the other (a free wait, and what makes those writes visible).
enum class Lane : uint8_t { kCompute = 0, kTransfer = 1 };

struct DeviceInfo {
  std::string name;
  std::string driver;
  VkPhysicalDeviceType type = VK_PHYSICAL_DEVICE_TYPE_OTHER;
  uint32_t subgroup_size = 0;
  uint32_t max_shared_memory = 0;
  uint32_t max_workgroup_invocations = 0;
  uint32_t max_workgroup_count[3] = {0, 0, 0};
  uint32_t max_push_constants = 0;
  float timestamp_period_ns = 0;  // 0 without compute timestamps or host query resets (GpuTimer)
  uint32_t timestamp_valid_bits = 0;
  // The transfer lane has a queue of its own (a second queue of the compute family), so its
  // work runs beside the compute lane's on the GPU. Without one (a family of one queue, or
  // KVTIER_VK_TRANSFER_LANE=0) both lanes submit to one queue, still with their own timelines.
  bool transfer_lane_own_queue = false;
  bool has_float64 = false;  // needed by the GPU quantizer
  // VK_EXT_external_memory_host is enabled: host memory at this alignment can be imported and
  // copied from or to by the GPU directly (0: not available, or KVTIER_VK_HOST_IMPORT=0).
  uint64_t host_import_alignment = 0;
  // KVTIER_VK_PIPELINE_STATS=1 and the driver supports VK_KHR_pipeline_executable_properties:
  // pipelines record the compiler's statistics (registers, spills), for kernel tuning.
  bool pipeline_stats = false;
  // Tensor cores through VK_NV_cooperative_matrix: 16x16x16 f16 x f16 + f32 in a subgroup of 32,
  // with shaderFloat16. Attention prefers them when present (KVTIER_VK_COOPMAT=0: never).
  bool coopmat_f16 = false;
  // coopmat_f16, and the device's 16x16 f32 fragments are laid out as the tensor-core attention
  // kernel assumes (kernels/common/mma_fragment.glsl; checked by a probe kernel at creation).
  // Attention takes the tensor-core path only then.
  bool coopmat_mma_fragments = false;
  // NVIDIA's cooperative matrix 2 (workgroup-scope tiles, row reductions, per-element functions)
  // and kernels compiled for it (KVTIER_VK_COOPMAT=0 or 1: not enabled).
  bool coopmat2 = false;
  uint32_t coopmat2_reserved_shared = 0;  // shared memory the driver keeps for those tiles
  uint32_t coopmat2_max_workgroup = 0;    // the most invocations a workgroup with them may have
  // coopmat_mma_fragments and coopmat2, and the KHR spelling's fragments are laid out the same
  // (probed too): the tensor-core kernels take their GL_KHR_cooperative_matrix spelling
  // (kernels/coopmat2/*_khr), whose typed operands the driver loads better (H100, bf16 prefill
  // attention at 16k tokens: 144 TFLOP/s against 110).
  bool coopmat_khr = false;
  // KVTIER_VK_COOPMAT=2: prefill attention defaults to the coopmat2 kernel. It does not unasked:
  // on the H100 it runs at 0.1-0.37 of the coopmat kernel (docs/benchmarks.md).
  bool prefer_coopmat2 = false;
};

// Thread-safe: submissions are serialized by an internal mutex (the host's call, not the GPU's
// work); pipelines are cached.
class VulkanContext {
 public:
  // kUnavailable with the reason when there is no Vulkan device (or none with the features).
  static Result<std::unique_ptr<VulkanContext>> create();
  ~VulkanContext();
  VulkanContext(const VulkanContext&) = delete;
  VulkanContext& operator=(const VulkanContext&) = delete;

  VkDevice device() const { return device_; }
  VkPhysicalDevice physical_device() const { return physical_; }
  const DeviceInfo& info() const { return info_; }
  uint32_t compute_family() const { return compute_family_; }

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
  // `timeout` passes (kUnavailable, "not reached in time").
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
  // With KVTIER_VK_VALIDATION=1, the validation layer's reports; null otherwise.
  const ValidationMessenger* validation() const { return validation_.get(); }

 private:
  VulkanContext() = default;
  Status init();

  std::unique_ptr<ValidationMessenger> validation_;  // destroyed in ~VulkanContext, before the instance
  VkInstance instance_ = VK_NULL_HANDLE;
  VkPhysicalDevice physical_ = VK_NULL_HANDLE;
  VkDevice device_ = VK_NULL_HANDLE;
  static size_t index(Lane lane) { return static_cast<size_t>(lane); }
  struct LaneState {
    VkQueue queue = VK_NULL_HANDLE;
    VkSemaphore timeline = VK_NULL_HANDLE;
    uint64_t next_value = 0;            // guarded by submit_mu_
    std::atomic<uint64_t> completed{0};  // raised by wait()
  };
  LaneState lanes_[2];  // by Lane
  uint32_t compute_family_ = 0;
  std::vector<Commands> idle_commands_[2];  // by Lane
  size_t command_pools_[2] = {0, 0};
  VkPhysicalDeviceMemoryProperties memory_{};
  DeviceInfo info_;

  std::mutex submit_mu_;    // guards queue submission (both lanes' queues) and next_value
  mutable std::mutex commands_mu_;  // guards idle_commands_ and command_pools_
  LogThrottle reset_failure_log_;
  std::mutex pipeline_mu_;  // guards pipelines_
  std::map<std::pair<std::string, std::vector<uint32_t>>, std::shared_ptr<ComputePipeline>> pipelines_;
};

// "vkCreateBuffer: VK_ERROR_OUT_OF_DEVICE_MEMORY (-2)"
Status vk_status(const char* what, VkResult r);

}  // namespace kvtier
