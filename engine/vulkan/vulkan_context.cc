#include "engine/vulkan/vulkan_context.h"

#include "engine/vulkan/coopmat2_support.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "base/log.h"
#include "engine/vulkan/command_batch.h"
#include "engine/vulkan/compute_pipeline.h"
#include "engine/vulkan/gpu_buffer.h"

namespace kvtier {

Status vk_status(const char* what, VkResult r) {
  const char* name = "VkResult";
  switch (r) {
    case VK_ERROR_OUT_OF_HOST_MEMORY: name = "VK_ERROR_OUT_OF_HOST_MEMORY"; break;
    case VK_ERROR_OUT_OF_DEVICE_MEMORY: name = "VK_ERROR_OUT_OF_DEVICE_MEMORY"; break;
    case VK_ERROR_INITIALIZATION_FAILED: name = "VK_ERROR_INITIALIZATION_FAILED"; break;
    case VK_ERROR_DEVICE_LOST: name = "VK_ERROR_DEVICE_LOST"; break;
    case VK_ERROR_FEATURE_NOT_PRESENT: name = "VK_ERROR_FEATURE_NOT_PRESENT"; break;
    case VK_ERROR_INCOMPATIBLE_DRIVER: name = "VK_ERROR_INCOMPATIBLE_DRIVER"; break;
    case VK_TIMEOUT: name = "VK_TIMEOUT"; break;
    default: break;
  }
  return Status(r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY
                    ? StatusCode::kResourceExhausted
                    : StatusCode::kUnavailable,
                std::string(what) + ": " + name + " (" + std::to_string(r) + ")");
}

#define VK_TRY(what, expr)                       \
  do {                                           \
    VkResult _r = (expr);                        \
    if (_r != VK_SUCCESS) return vk_status(what, _r); \
  } while (0)

namespace {

// Runs a coopmat_fragment_probe spelling: true when the device lays out 16x16 f32 fragments as
// kernels/common/mma_fragment.glsl says.
Result<bool> probe_mma_fragments(VulkanContext& ctx, const char* kernel) {
  KVTIER_ASSIGN_OR_RETURN(auto probe, ctx.pipeline(kernel, {}, sizeof(uint64_t)));
  KVTIER_ASSIGN_OR_RETURN(GpuBuffer flag, GpuBuffer::create(ctx, 4, MemoryKind::kDownload));
  KVTIER_ASSIGN_OR_RETURN(CommandBatch batch, CommandBatch::begin(ctx));
  const uint64_t address = flag.address();
  batch.dispatch(*probe, address, 1);
  KVTIER_RETURN_IF_ERROR(batch.submit_and_wait());
  uint32_t ok = 0;
  KVTIER_RETURN_IF_ERROR(download(ctx, flag, 0, std::span(reinterpret_cast<uint8_t*>(&ok), 4)));
  return ok == 1;
}

}  // namespace

Result<std::unique_ptr<VulkanContext>> VulkanContext::create() {
  std::unique_ptr<VulkanContext> ctx(new VulkanContext());
  KVTIER_RETURN_IF_ERROR(ctx->init());
  if (ctx->info_.coopmat_f16) {
    // A probe that cannot run (a driver that fails the cooperative-matrix shader, say) costs the
    // tensor-core attention, not the device: the scalar kernels still serve.
    Result<bool> probed = probe_mma_fragments(*ctx, "coopmat_fragment_probe");
    ctx->info_.coopmat_mma_fragments = probed.ok() && *probed;
    if (!probed.ok()) {
      spdlog::warn("vulkan: the cooperative-matrix fragment probe failed ({}); attention takes the scalar kernels",
                   probed.status().to_string());
    } else if (!*probed) {
      spdlog::warn("vulkan: cooperative-matrix fragments are laid out differently from what the tensor-core "
                   "attention kernel assumes; attention takes the scalar kernels on this device");
    }
  }
  if (ctx->info_.coopmat_mma_fragments && ctx->info_.coopmat2) {
    Result<bool> probed = probe_mma_fragments(*ctx, "coopmat_fragment_probe_khr");
    ctx->info_.coopmat_khr = probed.ok() && *probed;
    if (!ctx->info_.coopmat_khr) {
      spdlog::warn("vulkan: the KHR cooperative-matrix spelling {}; the tensor-core kernels keep the NV one",
                   probed.ok() ? "lays its fragments out differently" : "failed its probe (" + probed.status().to_string() + ")");
    }
  }
  return ctx;
}

namespace {

int type_rank(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return 0;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return 1;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return 2;
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return 3;
    default: return 4;
  }
}

// Whether the driver offers the cooperative-matrix shape the *_coopmat kernels are written for:
// 16x16x16, f16 inputs, f32 accumulator and result, subgroup scope.
bool has_f16_coopmat(VkInstance instance, VkPhysicalDevice physical) {
  auto get = reinterpret_cast<PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesNV>(
      vkGetInstanceProcAddr(instance, "vkGetPhysicalDeviceCooperativeMatrixPropertiesNV"));
  if (!get) return false;
  uint32_t n = 0;
  if (get(physical, &n, nullptr) != VK_SUCCESS) return false;
  std::vector<VkCooperativeMatrixPropertiesNV> props(n, {.sType = VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_NV});
  if (get(physical, &n, props.data()) != VK_SUCCESS) return false;
  return std::any_of(props.begin(), props.begin() + n, [](const VkCooperativeMatrixPropertiesNV& p) {
    return p.MSize == 16 && p.NSize == 16 && p.KSize == 16 && p.AType == VK_COMPONENT_TYPE_FLOAT16_NV &&
           p.BType == VK_COMPONENT_TYPE_FLOAT16_NV && p.CType == VK_COMPONENT_TYPE_FLOAT32_NV &&
           p.DType == VK_COMPONENT_TYPE_FLOAT32_NV && p.scope == VK_SCOPE_SUBGROUP_NV;
  });
}

}  // namespace

Status VulkanContext::init() {
  VkApplicationInfo app{.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO};
  app.pApplicationName = "kvtier";
  // 1.3 where the loader has it: the cooperative-matrix-2 kernels are SPIR-V 1.6. Everything else
  // needs only 1.2.
  uint32_t loader_version = VK_API_VERSION_1_0;
  if (vkEnumerateInstanceVersion(&loader_version) != VK_SUCCESS) loader_version = VK_API_VERSION_1_0;
  app.apiVersion = loader_version >= VK_API_VERSION_1_3 ? VK_API_VERSION_1_3 : VK_API_VERSION_1_2;
  VkInstanceCreateInfo ici{.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
  ici.pApplicationInfo = &app;
  const std::vector<const char*> validation_layers = ValidationMessenger::layers(),
                                 validation_extensions = ValidationMessenger::extensions();
  VkDebugUtilsMessengerCreateInfoEXT messenger_info{};
  if (ValidationMessenger::requested()) {
    KVTIER_RETURN_IF_ERROR(ValidationMessenger::check_available());
    validation_ = std::make_unique<ValidationMessenger>();
    messenger_info = validation_->create_info();
    ici.pNext = &messenger_info;  // instance creation is checked too
    ici.enabledLayerCount = static_cast<uint32_t>(validation_layers.size());
    ici.ppEnabledLayerNames = validation_layers.data();
    ici.enabledExtensionCount = static_cast<uint32_t>(validation_extensions.size());
    ici.ppEnabledExtensionNames = validation_extensions.data();
  }
  VkResult r = vkCreateInstance(&ici, nullptr, &instance_);
  if (r != VK_SUCCESS) {
    return unavailable("no Vulkan driver could be loaded (vkCreateInstance: " + std::to_string(r) +
                       "); install mesa-vulkan-drivers for the CPU device");
  }
  if (validation_) KVTIER_RETURN_IF_ERROR(validation_->attach(instance_));
  uint32_t n = 0;
  vkEnumeratePhysicalDevices(instance_, &n, nullptr);
  std::vector<VkPhysicalDevice> devices(n);
  vkEnumeratePhysicalDevices(instance_, &n, devices.data());
  if (devices.empty()) return unavailable("no Vulkan device found");

  std::vector<std::pair<VkPhysicalDevice, VkPhysicalDeviceProperties>> candidates;
  for (VkPhysicalDevice d : devices) {
    VkPhysicalDeviceProperties p;
    vkGetPhysicalDeviceProperties(d, &p);
    if (p.apiVersion >= VK_API_VERSION_1_2) candidates.emplace_back(d, p);
  }
  if (candidates.empty()) return unavailable("no Vulkan 1.2 device found");
  std::stable_sort(candidates.begin(), candidates.end(), [](const auto& a, const auto& b) {
    return type_rank(a.second.deviceType) < type_rank(b.second.deviceType);
  });
  size_t pick = 0;
  if (const char* want = std::getenv("KVTIER_VK_DEVICE"); want && *want) {
    char* end = nullptr;
    const long idx = std::strtol(want, &end, 10);
    bool found = false;
    if (*end == '\0' && idx >= 0 && static_cast<size_t>(idx) < candidates.size()) {
      pick = static_cast<size_t>(idx);
      found = true;
    }
    for (size_t i = 0; !found && i < candidates.size(); ++i) {
      if (std::strstr(candidates[i].second.deviceName, want)) {
        pick = i;
        found = true;
      }
    }
    if (!found) {
      std::string names;
      for (size_t i = 0; i < candidates.size(); ++i) {
        names += (i ? ", " : "") + std::to_string(i) + ": " + candidates[i].second.deviceName;
      }
      return unavailable(std::string("KVTIER_VK_DEVICE=") + want + " matches no device (" + names + ")");
    }
  }
  physical_ = candidates[pick].first;
  const VkPhysicalDeviceProperties& props = candidates[pick].second;

  VkPhysicalDeviceSubgroupProperties subgroup{.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
  VkPhysicalDeviceDriverProperties driver{.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES};
  subgroup.pNext = &driver;
  VkPhysicalDeviceExternalMemoryHostPropertiesEXT host_import{
      .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_MEMORY_HOST_PROPERTIES_EXT};
  driver.pNext = &host_import;
  VkPhysicalDeviceProperties2 props2{.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
  props2.pNext = &subgroup;
  vkGetPhysicalDeviceProperties2(physical_, &props2);
  info_.name = props.deviceName;
  info_.driver = std::string(driver.driverName) + " " + driver.driverInfo;
  info_.type = props.deviceType;
  info_.subgroup_size = subgroup.subgroupSize;
  info_.max_shared_memory = props.limits.maxComputeSharedMemorySize;
  info_.max_workgroup_invocations = props.limits.maxComputeWorkGroupInvocations;
  for (int i = 0; i < 3; ++i) info_.max_workgroup_count[i] = props.limits.maxComputeWorkGroupCount[i];
  info_.max_push_constants = props.limits.maxPushConstantsSize;
  const VkSubgroupFeatureFlags need_ops = VK_SUBGROUP_FEATURE_BASIC_BIT | VK_SUBGROUP_FEATURE_SHUFFLE_BIT;
  if ((subgroup.supportedOperations & need_ops) != need_ops ||
      !(subgroup.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT)) {
    return unavailable(info_.name + " lacks subgroup shuffles in compute shaders");
  }

  VkPhysicalDeviceVulkan12Features f12{.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  VkPhysicalDeviceFeatures2 f2{.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  f2.pNext = &f12;
  vkGetPhysicalDeviceFeatures2(physical_, &f2);
  if (!f12.bufferDeviceAddress || !f12.timelineSemaphore || !f2.features.shaderInt64) {
    return unavailable(info_.name + " lacks bufferDeviceAddress, timelineSemaphore or shaderInt64");
  }

  uint32_t nq = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(physical_, &nq, nullptr);
  std::vector<VkQueueFamilyProperties> families(nq);
  vkGetPhysicalDeviceQueueFamilyProperties(physical_, &nq, families.data());
  int compute = -1;
  for (uint32_t i = 0; i < nq && compute < 0; ++i) {
    if (families[i].queueFlags & VK_QUEUE_COMPUTE_BIT) compute = static_cast<int>(i);
  }
  if (compute < 0) return unavailable(info_.name + " has no compute queue");
  compute_family_ = static_cast<uint32_t>(compute);
  // The transfer lane runs the scatter and gather kernels, so it needs a compute queue: a second
  // one of the same family (no queue family ownership to transfer between lanes). A
  // transfer-only family could copy but not scatter.
  const char* lane_env = std::getenv("KVTIER_VK_TRANSFER_LANE");
  info_.transfer_lane_own_queue = families[compute_family_].queueCount >= 2 && !(lane_env && *lane_env == '0');
  // Timestamps (GpuTimer) also need queries reset from the host: a timer read before its batch
  // ran must say so rather than return whatever an unreset query holds.
  if (families[compute_family_].timestampValidBits > 0 && f12.hostQueryReset) {
    info_.timestamp_period_ns = props.limits.timestampPeriod;
    info_.timestamp_valid_bits = families[compute_family_].timestampValidBits;
  }

  const float priorities[2] = {1.0f, 1.0f};
  std::vector<VkDeviceQueueCreateInfo> queues;
  VkDeviceQueueCreateInfo qc{.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
  qc.queueFamilyIndex = compute_family_;
  qc.queueCount = info_.transfer_lane_own_queue ? 2 : 1;
  qc.pQueuePriorities = priorities;
  queues.push_back(qc);
  uint32_t ne = 0;
  vkEnumerateDeviceExtensionProperties(physical_, nullptr, &ne, nullptr);
  std::vector<VkExtensionProperties> exts(ne);
  vkEnumerateDeviceExtensionProperties(physical_, nullptr, &ne, exts.data());
  auto has_extension = [&](const char* name) {
    return std::any_of(exts.begin(), exts.end(),
                       [&](const VkExtensionProperties& e) { return std::strcmp(e.extensionName, name) == 0; });
  };
  std::vector<const char*> extensions;
  // Optional: the GPU copies host blocks where they lie (no staging copy on the CPU).
  // KVTIER_VK_HOST_IMPORT=0 turns it off, to compare against the staged path.
  const char* import_env = std::getenv("KVTIER_VK_HOST_IMPORT");
  if (has_extension(VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME) && !(import_env && *import_env == '0')) {
    extensions.push_back(VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME);
    info_.host_import_alignment = host_import.minImportedHostPointerAlignment;
  }
  // Optional: the compiler's statistics per pipeline, for tuning kernels.
  VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR exec_props{
      .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR};
  if (const char* want = std::getenv("KVTIER_VK_PIPELINE_STATS"); want && *want == '1' &&
      has_extension(VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME)) {
    extensions.push_back(VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME);
    exec_props.pipelineExecutableInfo = VK_TRUE;
    info_.pipeline_stats = true;
  }
  // Optional: tensor cores for attention and the tiny model's matmuls (the scalar kernels remain
  // the fallback; KVTIER_VK_COOPMAT=0 keeps to them).
  VkPhysicalDeviceCooperativeMatrixFeaturesNV coopmat{
      .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV};
  const char* coopmat_env = std::getenv("KVTIER_VK_COOPMAT");
  if (has_extension(VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME) && f12.shaderFloat16 &&
      info_.subgroup_size == 32 && (subgroup.supportedOperations & VK_SUBGROUP_FEATURE_VOTE_BIT) &&
      !(coopmat_env && *coopmat_env == '0') && has_f16_coopmat(instance_, physical_)) {
    extensions.push_back(VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME);
    coopmat.cooperativeMatrix = VK_TRUE;
    info_.coopmat_f16 = true;
  }
  // Optional: NVIDIA's cooperative matrix 2 (workgroup-scope tensor-core tiles) for prefill
  // attention; KVTIER_VK_COOPMAT=0 or 1 keeps to the paths above.
  Coopmat2Support coopmat2;
  coopmat2.query(physical_, std::min(app.apiVersion, props.apiVersion),
                 has_extension);
  info_.coopmat2 = coopmat2.usable() && f12.shaderFloat16 && f12.vulkanMemoryModel;
  info_.coopmat2_reserved_shared = coopmat2.reserved_shared_memory();
  info_.coopmat2_max_workgroup = coopmat2.max_workgroup_size();
  info_.prefer_coopmat2 = info_.coopmat2 && coopmat_env && std::strcmp(coopmat_env, "2") == 0;
  if (!info_.coopmat2) {
    spdlog::debug("vulkan: no cooperative matrix 2: {}",
                  coopmat2.usable() ? "no shaderFloat16 or vulkanMemoryModel" : coopmat2.why_not());
  }
  VkPhysicalDeviceVulkan12Features enable12{.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  void** chain = &enable12.pNext;
  if (info_.pipeline_stats) {
    *chain = &exec_props;
    chain = &exec_props.pNext;
  }
  if (info_.coopmat_f16) {
    *chain = &coopmat;
    chain = &coopmat.pNext;
  }
  if (info_.coopmat2) coopmat2.enable(extensions, chain);
  // The tensor-core kernels compute in f16 and declare the Vulkan memory model.
  if (info_.coopmat_f16 || info_.coopmat2) enable12.shaderFloat16 = VK_TRUE;
  enable12.vulkanMemoryModel = f12.vulkanMemoryModel;
  enable12.bufferDeviceAddress = VK_TRUE;
  enable12.timelineSemaphore = VK_TRUE;
  enable12.hostQueryReset = info_.timestamp_period_ns > 0 ? VK_TRUE : VK_FALSE;
  VkPhysicalDeviceFeatures2 enable{.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  enable.pNext = &enable12;
  enable.features.shaderInt64 = VK_TRUE;
  // Only the quantize kernel needs doubles (an exactly rounded reciprocal); without them it
  // reports itself unavailable.
  enable.features.shaderFloat64 = f2.features.shaderFloat64;
  info_.has_float64 = f2.features.shaderFloat64;
  VkDeviceCreateInfo dci{.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
  dci.pNext = &enable;
  dci.enabledExtensionCount = static_cast<uint32_t>(extensions.size());
  dci.ppEnabledExtensionNames = extensions.data();
  dci.queueCreateInfoCount = static_cast<uint32_t>(queues.size());
  dci.pQueueCreateInfos = queues.data();
  VK_TRY("vkCreateDevice", vkCreateDevice(physical_, &dci, nullptr, &device_));
  vkGetDeviceQueue(device_, compute_family_, 0, &lanes_[index(Lane::kCompute)].queue);
  vkGetDeviceQueue(device_, compute_family_, info_.transfer_lane_own_queue ? 1 : 0,
                   &lanes_[index(Lane::kTransfer)].queue);
  vkGetPhysicalDeviceMemoryProperties(physical_, &memory_);

  VkSemaphoreTypeCreateInfo tci{.sType = VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO};
  tci.semaphoreType = VK_SEMAPHORE_TYPE_TIMELINE;
  VkSemaphoreCreateInfo sci{.sType = VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO};
  sci.pNext = &tci;
  for (LaneState& lane : lanes_) {
    VK_TRY("vkCreateSemaphore", vkCreateSemaphore(device_, &sci, nullptr, &lane.timeline));
  }
  spdlog::info("vulkan: {} ({}), subgroup {}, {} KiB shared memory{}{}{}", info_.name, info_.driver,
               info_.subgroup_size, info_.max_shared_memory / 1024,
               info_.transfer_lane_own_queue ? ", transfer lane on its own queue" : ", one queue for both lanes",
               info_.host_import_alignment ? ", host memory import" : "",
               info_.coopmat2 ? ", cooperative matrices 2" : info_.coopmat_f16 ? ", cooperative matrices" : "");
  return ok_status();
}

VulkanContext::~VulkanContext() {
  if (device_) {
    vkDeviceWaitIdle(device_);
    {
      std::lock_guard lock(pipeline_mu_);
      pipelines_.clear();
    }
    for (LaneState& lane : lanes_) {
      if (lane.timeline) vkDestroySemaphore(device_, lane.timeline, nullptr);
    }
    for (auto& idle : idle_commands_) {
      for (const Commands& c : idle) vkDestroyCommandPool(device_, c.pool, nullptr);  // frees c.cb
    }
    vkDestroyDevice(device_, nullptr);
  }
  validation_.reset();
  if (instance_) vkDestroyInstance(instance_, nullptr);
}

Result<uint32_t> VulkanContext::memory_type(uint32_t type_bits, VkMemoryPropertyFlags required,
                                            VkMemoryPropertyFlags preferred) const {
  int best = -1, best_score = -1;
  for (uint32_t i = 0; i < memory_.memoryTypeCount; ++i) {
    if (!(type_bits & (1u << i))) continue;
    const VkMemoryPropertyFlags f = memory_.memoryTypes[i].propertyFlags;
    if ((f & required) != required) continue;
    const int score = __builtin_popcount(f & preferred);
    if (score > best_score) {
      best = static_cast<int>(i);
      best_score = score;
    }
  }
  if (best < 0) return unavailable("no Vulkan memory type with the required properties");
  return static_cast<uint32_t>(best);
}

Result<std::shared_ptr<ComputePipeline>> VulkanContext::pipeline(
    const std::string& kernel, const std::vector<uint32_t>& spec_constants,
    uint32_t push_constant_bytes) {
  std::lock_guard lock(pipeline_mu_);
  auto key = std::make_pair(kernel, spec_constants);
  auto it = pipelines_.find(key);
  if (it != pipelines_.end()) return it->second;
  KVTIER_ASSIGN_OR_RETURN(auto p, ComputePipeline::create(*this, kernel, spec_constants,
                                                          push_constant_bytes));
  pipelines_.emplace(key, p);
  return p;
}

Result<VulkanContext::Commands> VulkanContext::acquire_commands(Lane lane) {
  {
    std::lock_guard lock(commands_mu_);
    auto& idle = idle_commands_[index(lane)];
    if (!idle.empty()) {
      Commands c = idle.back();
      idle.pop_back();
      return c;
    }
  }
  Commands c;
  VkCommandPoolCreateInfo pci{.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  pci.flags = VK_COMMAND_POOL_CREATE_TRANSIENT_BIT;
  pci.queueFamilyIndex = compute_family_;  // both lanes' queues are of this family
  VK_TRY("vkCreateCommandPool", vkCreateCommandPool(device_, &pci, nullptr, &c.pool));
  VkCommandBufferAllocateInfo ai{.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
  ai.commandPool = c.pool;
  ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  ai.commandBufferCount = 1;
  if (VkResult r = vkAllocateCommandBuffers(device_, &ai, &c.cb); r != VK_SUCCESS) {
    vkDestroyCommandPool(device_, c.pool, nullptr);
    return vk_status("vkAllocateCommandBuffers", r);
  }
  std::lock_guard lock(commands_mu_);
  ++command_pools_[index(lane)];
  return c;
}

void VulkanContext::release_commands(Commands c, Lane lane) {
  // The pool is still this caller's alone: reset it (its buffer back to the initial state)
  // before another thread can take it.
  if (VkResult r = vkResetCommandPool(device_, c.pool, 0); r != VK_SUCCESS) {
    // Only a lost device or exhausted memory fails here, and then every batch does: throttled.
    if (auto n = reset_failure_log_.admit()) {
      spdlog::error("vulkan: vkResetCommandPool failed ({}); the pool is destroyed instead ({} similar suppressed)",
                    static_cast<int>(r), *n);
    }
    vkDestroyCommandPool(device_, c.pool, nullptr);
    std::lock_guard lock(commands_mu_);
    --command_pools_[index(lane)];
    return;
  }
  std::lock_guard lock(commands_mu_);
  idle_commands_[index(lane)].push_back(c);
}

std::pair<size_t, size_t> VulkanContext::command_pools() const {
  std::lock_guard lock(commands_mu_);
  return {command_pools_[0], command_pools_[1]};
}

Result<uint64_t> VulkanContext::submit(VkCommandBuffer cb, Lane lane) {
  std::lock_guard lock(submit_mu_);
  LaneState& own = lanes_[index(lane)];
  const LaneState& other = lanes_[1 - index(lane)];
  const uint64_t value = own.next_value + 1;
  // The lane's batches run in order: each waits for the lane's previous one. Across lanes only
  // what the host has seen complete is waited for (already signalled, so it costs nothing): a
  // block the other lane wrote before the host handed it over is visible here, and a prefill
  // never holds up an upload it does not need.
  const VkSemaphore waits[2] = {own.timeline, other.timeline};
  const uint64_t wait_values[2] = {value - 1, other.completed.load(std::memory_order_acquire)};
  const VkPipelineStageFlags stages[2] = {VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT};
  VkTimelineSemaphoreSubmitInfo ts{.sType = VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO};
  ts.signalSemaphoreValueCount = 1;
  ts.pSignalSemaphoreValues = &value;
  ts.waitSemaphoreValueCount = 2;
  ts.pWaitSemaphoreValues = wait_values;
  VkSubmitInfo si{.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO};
  si.pNext = &ts;
  si.commandBufferCount = 1;
  si.pCommandBuffers = &cb;
  si.signalSemaphoreCount = 1;
  si.pSignalSemaphores = &own.timeline;
  si.waitSemaphoreCount = 2;
  si.pWaitSemaphores = waits;
  si.pWaitDstStageMask = stages;
  VK_TRY("vkQueueSubmit", vkQueueSubmit(own.queue, 1, &si, VK_NULL_HANDLE));
  own.next_value = value;
  return value;
}

Status VulkanContext::wait(uint64_t value, Lane lane, std::chrono::nanoseconds timeout) {
  LaneState& l = lanes_[index(lane)];
  VkSemaphoreWaitInfo wi{.sType = VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO};
  wi.semaphoreCount = 1;
  wi.pSemaphores = &l.timeline;
  wi.pValues = &value;
  const uint64_t ns = timeout == std::chrono::nanoseconds::max() ? UINT64_MAX : static_cast<uint64_t>(timeout.count());
  const VkResult r = vkWaitSemaphores(device_, &wi, ns);
  if (r == VK_TIMEOUT) return unavailable("vulkan: timeline value " + std::to_string(value) + " not reached in time");
  if (r != VK_SUCCESS) return vk_status("vkWaitSemaphores", r);
  uint64_t seen = l.completed.load(std::memory_order_relaxed);
  while (seen < value && !l.completed.compare_exchange_weak(seen, value, std::memory_order_release)) {
  }
  return ok_status();
}

}  // namespace kvtier
