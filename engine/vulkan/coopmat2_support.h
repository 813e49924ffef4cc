// Coopmat2Support: finds and enables NVIDIA's cooperative matrix 2 (VK_NV_cooperative_matrix2 on
// VK_KHR_cooperative_matrix) for the kernels in kernels/coopmat2/. Debian 12's Vulkan
// headers (1.3.239) predate both extensions, so their structures are declared here.
#pragma once

#include <vulkan/vulkan.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace kvtier {

class Coopmat2Support {
 public:
  // Decides from the device's extensions, features and API version, the compiled kernels and
  // the KVTIER_VK_COOPMAT knob (VulkanOptions::coopmat; "0" or "1": not this path). `why_not()`
  // says why when it is not usable.
  void query(VkPhysicalDevice physical, uint32_t device_api_version,
             const std::function<bool(const char*)>& has_extension, const std::string& coopmat_knob);
  bool usable() const { return usable_; }
  const std::string& why_not() const { return why_not_; }
  // Shared memory the driver keeps for workgroup-scope matrices, out of the kernel's budget.
  uint32_t reserved_shared_memory() const { return reserved_shared_; }
  // The most invocations a workgroup using workgroup-scope matrices may have (more: wrong results).
  uint32_t max_workgroup_size() const { return max_workgroup_; }
  // Tensor-layout loads and stores (coopMatLoadTensorNV): the driver stages tiles from global
  // memory itself, pipelined, which the projections' matmul needs to reach the tensor cores' rate.
  bool tensor_addressing() const { return usable_ && nv2_.cooperativeMatrixTensorAddressing; }
  // When usable: the extensions to enable, and the feature structures chained after `*chain`
  // (which then points at the last one's pNext).
  void enable(std::vector<const char*>& extensions, void**& chain);

 private:
  struct KhrFeatures {  // VkPhysicalDeviceCooperativeMatrixFeaturesKHR
    VkStructureType sType = static_cast<VkStructureType>(1000506000);
    void* pNext = nullptr;
    VkBool32 cooperativeMatrix = VK_FALSE;
    VkBool32 cooperativeMatrixRobustBufferAccess = VK_FALSE;
  };
  struct Nv2Features {  // VkPhysicalDeviceCooperativeMatrix2FeaturesNV
    VkStructureType sType = static_cast<VkStructureType>(1000593000);
    void* pNext = nullptr;
    VkBool32 cooperativeMatrixWorkgroupScope = VK_FALSE;
    VkBool32 cooperativeMatrixFlexibleDimensions = VK_FALSE;
    VkBool32 cooperativeMatrixReductions = VK_FALSE;
    VkBool32 cooperativeMatrixConversions = VK_FALSE;
    VkBool32 cooperativeMatrixPerElementOperations = VK_FALSE;
    VkBool32 cooperativeMatrixTensorAddressing = VK_FALSE;
    VkBool32 cooperativeMatrixBlockLoads = VK_FALSE;
  };
  struct Nv2Properties {  // VkPhysicalDeviceCooperativeMatrix2PropertiesNV
    VkStructureType sType = static_cast<VkStructureType>(1000593002);
    void* pNext = nullptr;
    uint32_t cooperativeMatrixWorkgroupScopeMaxWorkgroupSize = 0;
    uint32_t cooperativeMatrixFlexibleDimensionsMaxDimension = 0;
    uint32_t cooperativeMatrixWorkgroupScopeReservedSharedMemory = 0;
  };

  bool usable_ = false;
  std::string why_not_;
  uint32_t reserved_shared_ = 0;
  uint32_t max_workgroup_ = 0;
  KhrFeatures khr_;
  Nv2Features nv2_;
};

}  // namespace kvtier
