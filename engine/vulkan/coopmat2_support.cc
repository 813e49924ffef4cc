#include "engine/vulkan/coopmat2_support.h"

#include <cstdlib>

#include "kernels/spirv_registry.h"

namespace kvtier {

namespace {
constexpr const char* kKhrCoopmat = "VK_KHR_cooperative_matrix";
constexpr const char* kNvCoopmat2 = "VK_NV_cooperative_matrix2";
}  // namespace

void Coopmat2Support::query(VkPhysicalDevice physical, uint32_t device_api_version,
                            const std::function<bool(const char*)>& has_extension,
                            const std::string& coopmat_knob) {
  usable_ = false;
  if (!coopmat_knob.empty() && (coopmat_knob[0] == '0' || coopmat_knob[0] == '1')) {
    why_not_ = "KVTIER_VK_COOPMAT=" + coopmat_knob;
    return;
  }
  if (spirv_for("paged_attention_varlen_cm2").empty()) {
    why_not_ = "built without a glslang that compiles cooperative matrix 2 (scripts/glslang.sh)";
    return;
  }
  if (!has_extension(kKhrCoopmat) || !has_extension(kNvCoopmat2)) {
    why_not_ = "the device lacks VK_NV_cooperative_matrix2";
    return;
  }
  if (device_api_version < VK_API_VERSION_1_3) {  // the kernels are SPIR-V 1.6
    why_not_ = "the device's Vulkan is older than 1.3";
    return;
  }
  khr_.pNext = &nv2_;
  nv2_.pNext = nullptr;
  VkPhysicalDeviceFeatures2 f2{.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  f2.pNext = &khr_;
  vkGetPhysicalDeviceFeatures2(physical, &f2);
  if (!khr_.cooperativeMatrix || !nv2_.cooperativeMatrixWorkgroupScope || !nv2_.cooperativeMatrixFlexibleDimensions ||
      !nv2_.cooperativeMatrixReductions || !nv2_.cooperativeMatrixConversions ||
      !nv2_.cooperativeMatrixPerElementOperations) {
    why_not_ = "the device lacks a cooperative-matrix-2 feature the kernels use";
    return;
  }
  Nv2Properties props;
  VkPhysicalDeviceProperties2 p2{.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
  p2.pNext = &props;
  vkGetPhysicalDeviceProperties2(physical, &p2);
  reserved_shared_ = props.cooperativeMatrixWorkgroupScopeReservedSharedMemory;
  max_workgroup_ = props.cooperativeMatrixWorkgroupScopeMaxWorkgroupSize;
  usable_ = true;
  why_not_.clear();
}

void Coopmat2Support::enable(std::vector<const char*>& extensions, void**& chain) {
  if (!usable_) return;
  extensions.push_back(kKhrCoopmat);
  extensions.push_back(kNvCoopmat2);
  // Only what the kernels use: tensor addressing where the device has it (the matmul's loads);
  // robust access and block loads stay off.
  khr_.cooperativeMatrixRobustBufferAccess = VK_FALSE;
  nv2_.cooperativeMatrixBlockLoads = VK_FALSE;
  khr_.pNext = &nv2_;
  nv2_.pNext = nullptr;
  *chain = &khr_;
  chain = &nv2_.pNext;
}

}  // namespace kvtier
