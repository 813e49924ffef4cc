#include "engine/vulkan/vulkan_device.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "base/log.h"
#include "engine/vulkan/coopmat2_support.h"
#include "kernels/spirv_registry.h"

namespace kvtier {

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

VulkanOptions VulkanOptions::from_environment() {
  auto text = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v ? v : "");
  };
  VulkanOptions o;
  o.device = text("KVTIER_VK_DEVICE");
  o.transfer_queue = text("KVTIER_VK_TRANSFER_LANE").substr(0, 1) != "0";
  o.host_import = text("KVTIER_VK_HOST_IMPORT").substr(0, 1) != "0";
  o.upload_in_place = text("KVTIER_VK_UPLOAD_IN_PLACE").substr(0, 1) != "0";
  o.pipeline_stats = text("KVTIER_VK_PIPELINE_STATS").substr(0, 1) == "1";
  o.validation = text("KVTIER_VK_VALIDATION") == "1";
  o.coopmat = text("KVTIER_VK_COOPMAT");
  // Microseconds, or -1 (the default) when unset; a value that is not a whole number of them is
  // warned of and ignored, not read as 0 (which would turn the poll or the naps off).
  auto micros = [&](const char* name) {
    const std::string v = text(name);
    if (v.empty()) return -1;
    char* end = nullptr;
    errno = 0;
    const long n = std::strtol(v.c_str(), &end, 10);
    if (errno != 0 || end == v.c_str() || *end != '\0' || n < 0 || n > 60'000'000) {
      spdlog::warn("vulkan: {}={} is not a number of microseconds (0-60000000); using the default",
                   name, v);
      return -1;
    }
    return static_cast<int>(n);
  };
  o.spin_wait_us = micros("KVTIER_VK_SPIN_US");
  o.nap_us = micros("KVTIER_VK_NAP_US");
  return o;
}

struct VulkanDevice::Query {
  VkPhysicalDeviceProperties props{};
  VkPhysicalDeviceSubgroupProperties subgroup{.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
  VkPhysicalDeviceDriverProperties driver{.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES};
  VkPhysicalDeviceExternalMemoryHostPropertiesEXT host_import{
      .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_MEMORY_HOST_PROPERTIES_EXT};
  VkPhysicalDeviceVulkan12Features f12{.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  VkPhysicalDeviceFeatures2 f2{.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  std::vector<VkQueueFamilyProperties> families;
  std::vector<VkExtensionProperties> extensions;

  Query() = default;
  Query(const Query&) = delete;  // the pNext chains point into it
  bool has_extension(const char* name) const {
    return std::any_of(extensions.begin(), extensions.end(),
                       [&](const VkExtensionProperties& e) { return std::strcmp(e.extensionName, name) == 0; });
  }
};

Result<std::unique_ptr<VulkanDevice>> VulkanDevice::open(const VulkanOptions& options) {
  std::unique_ptr<VulkanDevice> dev(new VulkanDevice(options));
  // 1.3 where the loader has it: the cooperative-matrix-2 kernels are SPIR-V 1.6. Everything else
  // needs only 1.2.
  uint32_t loader_version = VK_API_VERSION_1_0;
  if (vkEnumerateInstanceVersion(&loader_version) != VK_SUCCESS) loader_version = VK_API_VERSION_1_0;
  const uint32_t api_version = loader_version >= VK_API_VERSION_1_3 ? VK_API_VERSION_1_3 : VK_API_VERSION_1_2;
  KVTIER_RETURN_IF_ERROR(dev->create_instance(api_version));
  Query q;
  KVTIER_RETURN_IF_ERROR(dev->choose(q.props));
  KVTIER_RETURN_IF_ERROR(dev->query(q));
  KVTIER_RETURN_IF_ERROR(dev->create(q, api_version));
  return dev;
}

VulkanDevice::~VulkanDevice() {
  if (device_) vkDestroyDevice(device_, nullptr);
  validation_.reset();
  if (instance_) vkDestroyInstance(instance_, nullptr);
}

Status VulkanDevice::create_instance(uint32_t api_version) {
  VkApplicationInfo app{.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO};
  app.pApplicationName = "kvtier";
  app.apiVersion = api_version;
  VkInstanceCreateInfo ici{.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
  ici.pApplicationInfo = &app;
  const std::vector<const char*> validation_layers = ValidationMessenger::layers(),
                                 validation_extensions = ValidationMessenger::extensions();
  VkDebugUtilsMessengerCreateInfoEXT messenger_info{};
  if (options_.validation) {
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
  return ok_status();
}

// The best Vulkan 1.2 device (discrete first), or the one options_.device names by index or by
// part of its name.
Status VulkanDevice::choose(VkPhysicalDeviceProperties& props) {
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
  if (const std::string& want = options_.device; !want.empty()) {
    char* end = nullptr;
    const long idx = std::strtol(want.c_str(), &end, 10);
    bool found = false;
    if (*end == '\0' && idx >= 0 && static_cast<size_t>(idx) < candidates.size()) {
      pick = static_cast<size_t>(idx);
      found = true;
    }
    for (size_t i = 0; !found && i < candidates.size(); ++i) {
      if (std::strstr(candidates[i].second.deviceName, want.c_str())) {
        pick = i;
        found = true;
      }
    }
    if (!found) {
      std::string names;
      for (size_t i = 0; i < candidates.size(); ++i) {
        names += (i ? ", " : "") + std::to_string(i) + ": " + candidates[i].second.deviceName;
      }
      return unavailable("KVTIER_VK_DEVICE=" + want + " matches no device (" + names + ")");
    }
  }
  physical_ = candidates[pick].first;
  props = candidates[pick].second;
  return ok_status();
}

// Reads what the kernels depend on into info_ and refuses a device that lacks what they all need.
Status VulkanDevice::query(Query& q) {
  q.subgroup.pNext = &q.driver;
  q.driver.pNext = &q.host_import;
  VkPhysicalDeviceProperties2 props2{.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
  props2.pNext = &q.subgroup;
  vkGetPhysicalDeviceProperties2(physical_, &props2);
  const VkPhysicalDeviceProperties& props = q.props;
  info_.name = props.deviceName;
  info_.driver = std::string(q.driver.driverName) + " " + q.driver.driverInfo;
  info_.type = props.deviceType;
  info_.subgroup_size = q.subgroup.subgroupSize;
  info_.max_shared_memory = props.limits.maxComputeSharedMemorySize;
  info_.max_workgroup_invocations = props.limits.maxComputeWorkGroupInvocations;
  for (int i = 0; i < 3; ++i) info_.max_workgroup_count[i] = props.limits.maxComputeWorkGroupCount[i];
  info_.max_push_constants = props.limits.maxPushConstantsSize;
  const VkSubgroupFeatureFlags need_ops = VK_SUBGROUP_FEATURE_BASIC_BIT | VK_SUBGROUP_FEATURE_SHUFFLE_BIT;
  if ((q.subgroup.supportedOperations & need_ops) != need_ops ||
      !(q.subgroup.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT)) {
    return unavailable(info_.name + " lacks subgroup shuffles in compute shaders");
  }

  q.f2.pNext = &q.f12;
  vkGetPhysicalDeviceFeatures2(physical_, &q.f2);
  if (!q.f12.bufferDeviceAddress || !q.f12.timelineSemaphore || !q.f2.features.shaderInt64) {
    return unavailable(info_.name + " lacks bufferDeviceAddress, timelineSemaphore or shaderInt64");
  }

  uint32_t nq = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(physical_, &nq, nullptr);
  q.families.resize(nq);
  vkGetPhysicalDeviceQueueFamilyProperties(physical_, &nq, q.families.data());
  int compute = -1;
  for (uint32_t i = 0; i < nq && compute < 0; ++i) {
    if (q.families[i].queueFlags & VK_QUEUE_COMPUTE_BIT) compute = static_cast<int>(i);
  }
  if (compute < 0) return unavailable(info_.name + " has no compute queue");
  compute_family_ = static_cast<uint32_t>(compute);
  const VkQueueFamilyProperties& family = q.families[compute_family_];
  // The transfer lane runs the scatter and gather kernels, so it needs a compute queue: a second
  // one of the same family (no queue family ownership to transfer between lanes). A
  // transfer-only family could copy but not scatter.
  info_.transfer_lane_own_queue = family.queueCount >= 2 && options_.transfer_queue;
  // Timestamps (GpuTimer) also need queries reset from the host: a timer read before its batch
  // ran must say so rather than return whatever an unreset query holds.
  if (family.timestampValidBits > 0 && q.f12.hostQueryReset) {
    info_.timestamp_period_ns = props.limits.timestampPeriod;
    info_.timestamp_valid_bits = family.timestampValidBits;
  }

  uint32_t ne = 0;
  vkEnumerateDeviceExtensionProperties(physical_, nullptr, &ne, nullptr);
  q.extensions.resize(ne);
  vkEnumerateDeviceExtensionProperties(physical_, nullptr, &ne, q.extensions.data());
  if (q.has_extension(VK_NV_SHADER_SM_BUILTINS_EXTENSION_NAME)) {
    VkPhysicalDeviceShaderSMBuiltinsPropertiesNV sm{
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_SM_BUILTINS_PROPERTIES_NV};
    VkPhysicalDeviceProperties2 sm_props{.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2,
                                         .pNext = &sm};
    vkGetPhysicalDeviceProperties2(physical_, &sm_props);
    info_.sm_count = sm.shaderSMCount;
  }
  return ok_status();
}

// The logical device with the queues of both lanes and every optional feature the device has and
// options_ allows.
Status VulkanDevice::create(const Query& q, uint32_t api_version) {
  const float priorities[2] = {1.0f, 1.0f};
  VkDeviceQueueCreateInfo qc{.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
  qc.queueFamilyIndex = compute_family_;
  qc.queueCount = info_.transfer_lane_own_queue ? 2 : 1;
  qc.pQueuePriorities = priorities;
  auto has_extension = [&](const char* name) { return q.has_extension(name); };
  std::vector<const char*> extensions;
  // Optional: the GPU copies host blocks where they lie (no staging copy on the CPU).
  if (has_extension(VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME) && options_.host_import) {
    extensions.push_back(VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME);
    info_.host_import_alignment = q.host_import.minImportedHostPointerAlignment;
  }
  // Optional: the compiler's statistics per pipeline, for tuning kernels.
  VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR exec_props{
      .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR};
  if (options_.pipeline_stats && has_extension(VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME)) {
    extensions.push_back(VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME);
    exec_props.pipelineExecutableInfo = VK_TRUE;
    info_.pipeline_stats = true;
  }
  // Optional: tensor cores for attention and the tiny model's matmuls (the scalar kernels remain
  // the fallback; coopmat "0" keeps to them).
  VkPhysicalDeviceCooperativeMatrixFeaturesNV coopmat{
      .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV};
  if (has_extension(VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME) && q.f12.shaderFloat16 &&
      info_.subgroup_size == 32 && (q.subgroup.supportedOperations & VK_SUBGROUP_FEATURE_VOTE_BIT) &&
      options_.coopmat.substr(0, 1) != "0" && has_f16_coopmat(instance_, physical_)) {
    extensions.push_back(VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME);
    coopmat.cooperativeMatrix = VK_TRUE;
    info_.coopmat_f16 = true;
  }
  // Optional: NVIDIA's cooperative matrix 2 (workgroup-scope tensor-core tiles) for prefill
  // attention; coopmat "0" or "1" keeps to the paths above.
  Coopmat2Support coopmat2;
  coopmat2.query(physical_, std::min(api_version, q.props.apiVersion), has_extension, options_.coopmat);
  info_.coopmat2 = coopmat2.usable() && q.f12.shaderFloat16 && q.f12.vulkanMemoryModel;
  info_.coopmat2_reserved_shared = coopmat2.reserved_shared_memory();
  info_.coopmat2_max_workgroup = coopmat2.max_workgroup_size();
  info_.coopmat2_tensor_loads =
      info_.coopmat2 && coopmat2.tensor_addressing() && !spirv_for("matmul_cm2").empty();
  info_.prefer_coopmat2 = info_.coopmat2 && options_.coopmat == "2";
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
  enable12.vulkanMemoryModel = q.f12.vulkanMemoryModel;
  enable12.bufferDeviceAddress = VK_TRUE;
  enable12.timelineSemaphore = VK_TRUE;
  enable12.hostQueryReset = info_.timestamp_period_ns > 0 ? VK_TRUE : VK_FALSE;
  VkPhysicalDeviceFeatures2 enable{.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  enable.pNext = &enable12;
  enable.features.shaderInt64 = VK_TRUE;
  // Only the quantize kernel needs doubles (an exactly rounded reciprocal); without them it
  // reports itself unavailable.
  enable.features.shaderFloat64 = q.f2.features.shaderFloat64;
  info_.has_float64 = q.f2.features.shaderFloat64;
  VkDeviceCreateInfo dci{.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
  dci.pNext = &enable;
  dci.enabledExtensionCount = static_cast<uint32_t>(extensions.size());
  dci.ppEnabledExtensionNames = extensions.data();
  dci.queueCreateInfoCount = 1;
  dci.pQueueCreateInfos = &qc;
  KVTIER_VK_TRY("vkCreateDevice", vkCreateDevice(physical_, &dci, nullptr, &device_));
  vkGetDeviceQueue(device_, compute_family_, 0, &queues_[0]);
  vkGetDeviceQueue(device_, compute_family_, info_.transfer_lane_own_queue ? 1 : 0, &queues_[1]);
  vkGetPhysicalDeviceMemoryProperties(physical_, &memory_);
  return ok_status();
}

}  // namespace kvtier
