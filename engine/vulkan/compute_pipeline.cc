#include "engine/vulkan/compute_pipeline.h"

#include <vector>

#include "engine/vulkan/vulkan_context.h"
#include "kernels/spirv_registry.h"

namespace kvtier {

Result<std::shared_ptr<ComputePipeline>> ComputePipeline::create(
    VulkanContext& ctx, const std::string& kernel, const std::vector<uint32_t>& spec_constants,
    uint32_t push_constant_bytes) {
  std::span<const uint32_t> spirv = spirv_for(kernel);
  if (spirv.empty()) return not_found("no compiled kernel named '" + kernel + "'");
  if (push_constant_bytes > ctx.info().max_push_constants) {
    return unavailable(kernel + ": " + std::to_string(push_constant_bytes) +
                       " bytes of push constants exceed the device's " +
                       std::to_string(ctx.info().max_push_constants));
  }
  std::shared_ptr<ComputePipeline> p(new ComputePipeline());
  p->device_ = ctx.device();
  p->push_bytes_ = push_constant_bytes;
  p->kernel_ = kernel;

  VkShaderModuleCreateInfo mci{.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
  mci.codeSize = spirv.size_bytes();
  mci.pCode = spirv.data();
  if (VkResult r = vkCreateShaderModule(p->device_, &mci, nullptr, &p->module_); r != VK_SUCCESS) {
    return vk_status(("vkCreateShaderModule " + kernel).c_str(), r);
  }
  VkPushConstantRange range{VK_SHADER_STAGE_COMPUTE_BIT, 0, push_constant_bytes};
  VkPipelineLayoutCreateInfo lci{.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
  lci.pushConstantRangeCount = push_constant_bytes ? 1 : 0;
  lci.pPushConstantRanges = &range;
  if (VkResult r = vkCreatePipelineLayout(p->device_, &lci, nullptr, &p->layout_); r != VK_SUCCESS) {
    return vk_status("vkCreatePipelineLayout", r);
  }
  std::vector<VkSpecializationMapEntry> entries(spec_constants.size());
  for (uint32_t i = 0; i < spec_constants.size(); ++i) {
    entries[i] = {i, static_cast<uint32_t>(i * sizeof(uint32_t)), sizeof(uint32_t)};
  }
  VkSpecializationInfo spec{static_cast<uint32_t>(entries.size()), entries.data(),
                            spec_constants.size() * sizeof(uint32_t), spec_constants.data()};
  VkComputePipelineCreateInfo pci{.sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
  pci.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
  pci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
  pci.stage.module = p->module_;
  pci.stage.pName = "main";
  pci.stage.pSpecializationInfo = spec_constants.empty() ? nullptr : &spec;
  pci.layout = p->layout_;
  if (ctx.info().pipeline_stats) pci.flags |= VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR;
  if (VkResult r = vkCreateComputePipelines(p->device_, VK_NULL_HANDLE, 1, &pci, nullptr, &p->pipeline_);
      r != VK_SUCCESS) {
    return vk_status(("vkCreateComputePipelines " + kernel).c_str(), r);
  }
  if (ctx.info().pipeline_stats) {
    auto get_stats = reinterpret_cast<PFN_vkGetPipelineExecutableStatisticsKHR>(
        vkGetDeviceProcAddr(p->device_, "vkGetPipelineExecutableStatisticsKHR"));
    VkPipelineExecutableInfoKHR exe{.sType = VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR,
                                    .pipeline = p->pipeline_, .executableIndex = 0};
    uint32_t n = 0;
    if (get_stats && get_stats(p->device_, &exe, &n, nullptr) == VK_SUCCESS) {
      std::vector<VkPipelineExecutableStatisticKHR> stats(
          n, {.sType = VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR});
      get_stats(p->device_, &exe, &n, stats.data());
      for (const auto& st : stats) {
        p->statistics_ += std::string(p->statistics_.empty() ? "" : ", ") + st.name + ": ";
        switch (st.format) {
          case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR: p->statistics_ += st.value.b32 ? "yes" : "no"; break;
          case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR: p->statistics_ += std::to_string(st.value.i64); break;
          case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR: p->statistics_ += std::to_string(st.value.u64); break;
          case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_FLOAT64_KHR: p->statistics_ += std::to_string(st.value.f64); break;
          default: break;
        }
      }
    }
  }
  return p;
}

ComputePipeline::~ComputePipeline() {
  if (pipeline_) vkDestroyPipeline(device_, pipeline_, nullptr);
  if (layout_) vkDestroyPipelineLayout(device_, layout_, nullptr);
  if (module_) vkDestroyShaderModule(device_, module_, nullptr);
}

}  // namespace kvtier
