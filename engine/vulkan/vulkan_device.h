// VulkanDevice: the Vulkan instance, the physical device kvtier runs on, the logical device with
// the queues of both lanes, and what was learned of the device (DeviceInfo). open() picks the
// device (VulkanOptions::device by index or by part of its name, else the best: a discrete GPU
// first, then any), refuses one that lacks what every kernel needs — bufferDeviceAddress and
// shaderInt64 (kernels address buffers by 64-bit pointers), timelineSemaphore, subgroup shuffles
// in compute shaders — and enables every optional feature (host memory import, cooperative
// matrices, pipeline statistics) the device has and the options allow. VulkanContext runs work on
// it; this destroys what it created, after everything made on the device is gone.
#pragma once

#include <vulkan/vulkan.h>

#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"
#include "engine/vulkan/validation_messenger.h"

namespace kvtier {

// Where a batch is submitted. Each lane executes its batches in submission order; the two lanes
// are ordered only where the host orders them: a batch on one lane waits for everything the
// host has seen complete on the other (a free wait, and what makes those writes visible).
enum class Lane : uint8_t { kCompute = 0, kTransfer = 1 };

struct DeviceInfo {
  std::string name;
  std::string driver;
  VkPhysicalDeviceType type = VK_PHYSICAL_DEVICE_TYPE_OTHER;
  uint32_t subgroup_size = 0;
  // Streaming multiprocessors (VK_NV_shader_sm_builtins); 0 where the device does not say. The
  // matmul launcher sizes its tiles to fill whole waves of them.
  uint32_t sm_count = 0;
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
  // coopmat2 with tensor-layout loads and stores, and the matmul kernel built for them
  // (kernels/coopmat2/matmul_cm2.comp): the model's projections run on it, from f16 activations.
  bool coopmat2_tensor_loads = false;
  // coopmat_mma_fragments and coopmat2, and the KHR spelling's fragments are laid out the same
  // (probed too): the tensor-core kernels take their GL_KHR_cooperative_matrix spelling
  // (kernels/coopmat2/*_khr), whose typed operands the driver loads better (H100, bf16 prefill
  // attention at 16k tokens: 144 TFLOP/s against 110).
  bool coopmat_khr = false;
  // KVTIER_VK_COOPMAT=2: prefill attention defaults to the coopmat2 kernel. It does not unasked:
  // on the H100 it runs at 0.1-0.37 of the coopmat kernel (docs/benchmarks.md).
  bool prefer_coopmat2 = false;
};

// The engine's knobs. Read from the environment once, where a context is created; everything
// below takes them from VulkanContext::options(). For comparing paths and for tuning, not for
// production (each default is the fast path).
struct VulkanOptions {
  std::string device;           // KVTIER_VK_DEVICE: an index or part of a name; empty: the best
  bool transfer_queue = true;   // KVTIER_VK_TRANSFER_LANE=0: both lanes on one queue
  bool host_import = true;      // KVTIER_VK_HOST_IMPORT=0: no GPU reads of host memory in place
  bool upload_in_place = true;  // KVTIER_VK_UPLOAD_IN_PLACE=0: the GPU tier stages its uploads
  bool pipeline_stats = false;  // KVTIER_VK_PIPELINE_STATS=1: compiler statistics per pipeline
  bool validation = false;      // KVTIER_VK_VALIDATION=1: the Khronos validation layer
  // KVTIER_VK_COOPMAT: "0" the scalar kernels only, "1" no cooperative matrix 2, "2" prefer
  // cooperative matrix 2 where both serve; empty: the default choice per kernel.
  std::string coopmat;
  // KVTIER_VK_SPIN_US: how long a wait polls the timeline before it sleeps (in naps, below, or in
  // the driver); -1 (unset): VulkanContext's default for the device. A GPU hit's forward is due
  // within a millisecond, and waking from NVIDIA's blocking wait added ~0.1 ms to it (H200 host;
  // VulkanContext::wait).
  int spin_wait_us = -1;
  // KVTIER_VK_NAP_US: after the poll, how long a wait sleeps between looks at the timeline; 0:
  // it sleeps in the driver's blocking wait instead; -1 (unset): VulkanContext's default.
  int nap_us = -1;

  static VulkanOptions from_environment();
};

class VulkanDevice {
 public:
  // kUnavailable with the reason when there is no Vulkan device (or none with the features).
  static Result<std::unique_ptr<VulkanDevice>> open(const VulkanOptions& options);
  ~VulkanDevice();
  VulkanDevice(const VulkanDevice&) = delete;
  VulkanDevice& operator=(const VulkanDevice&) = delete;

  VkInstance instance() const { return instance_; }
  VkPhysicalDevice physical() const { return physical_; }
  VkDevice device() const { return device_; }
  uint32_t compute_family() const { return compute_family_; }
  // The lane's queue: the transfer lane's is the compute lane's when it has none of its own.
  VkQueue queue(Lane lane) const { return queues_[static_cast<size_t>(lane)]; }
  const VkPhysicalDeviceMemoryProperties& memory() const { return memory_; }
  const DeviceInfo& info() const { return info_; }
  // For VulkanContext's probes, which complete what only running a kernel tells.
  DeviceInfo& mutable_info() { return info_; }
  const VulkanOptions& options() const { return options_; }
  const ValidationMessenger* validation() const { return validation_.get(); }

 private:
  explicit VulkanDevice(VulkanOptions options) : options_(std::move(options)) {}
  // What open() learns of the chosen device before it creates the logical device.
  struct Query;
  // The steps of open(), in order.
  Status create_instance(uint32_t api_version);
  Status choose(VkPhysicalDeviceProperties& props);
  Status query(Query& q);
  Status create(const Query& q, uint32_t api_version);

  VulkanOptions options_;
  std::unique_ptr<ValidationMessenger> validation_;  // destroyed before the instance
  VkInstance instance_ = VK_NULL_HANDLE;
  VkPhysicalDevice physical_ = VK_NULL_HANDLE;
  VkDevice device_ = VK_NULL_HANDLE;
  uint32_t compute_family_ = 0;
  VkQueue queues_[2] = {VK_NULL_HANDLE, VK_NULL_HANDLE};  // by Lane
  VkPhysicalDeviceMemoryProperties memory_{};
  DeviceInfo info_;
};

// "vkCreateBuffer: VK_ERROR_OUT_OF_DEVICE_MEMORY (-2)"
Status vk_status(const char* what, VkResult r);

// Returns vk_status(what, r) from the calling function when `expr` is not VK_SUCCESS.
#define KVTIER_VK_TRY(what, expr)                      \
  do {                                                 \
    const VkResult vk_try_result = (expr);             \
    if (vk_try_result != VK_SUCCESS) return ::kvtier::vk_status(what, vk_try_result); \
  } while (0)

}  // namespace kvtier
