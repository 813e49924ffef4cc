// ComputePipeline: one kernel from kernels/ (embedded SPIR-V) specialized with constants
// (constant_id i gets spec_constants[i]), with a push-constant block of the given size and no
// descriptor sets (kernels take buffers by device address). Built once per specialization and
// cached by VulkanContext::pipeline().
#pragma once

#include <vulkan/vulkan.h>

#include <memory>
#include <string>
#include <vector>

#include "base/status.h"

namespace kvtier {

class VulkanContext;

// Immutable; thread-safe to use from many command batches.
class ComputePipeline {
 public:
  static Result<std::shared_ptr<ComputePipeline>> create(VulkanContext& ctx, const std::string& kernel,
                                                         const std::vector<uint32_t>& spec_constants,
                                                         uint32_t push_constant_bytes);
  ~ComputePipeline();
  ComputePipeline(const ComputePipeline&) = delete;
  ComputePipeline& operator=(const ComputePipeline&) = delete;

  VkPipeline handle() const { return pipeline_; }
  VkPipelineLayout layout() const { return layout_; }
  uint32_t push_constant_bytes() const { return push_bytes_; }
  const std::string& kernel() const { return kernel_; }
  // "Registers: 96, Local memory: 0, ..." when VulkanContext captured statistics, else empty.
  const std::string& statistics() const { return statistics_; }

 private:
  ComputePipeline() = default;
  VkDevice device_ = VK_NULL_HANDLE;
  VkShaderModule module_ = VK_NULL_HANDLE;
  VkPipelineLayout layout_ = VK_NULL_HANDLE;
  VkPipeline pipeline_ = VK_NULL_HANDLE;
  uint32_t push_bytes_ = 0;
  std::string kernel_;
  std::string statistics_;
};

}  // namespace kvtier
