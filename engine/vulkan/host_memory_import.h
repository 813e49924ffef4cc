// HostMemoryImport: lets the GPU copy blocks straight from, and into, the host memory they live in
// (VK_EXT_external_memory_host). Host blocks live in LargeBufferCache's chunks (base/); each chunk
// is imported once, when a transfer first touches it, and stays imported (and held, so it is never
// unmapped) until this object goes. A block then crosses the bus by DMA from where it lies, without
// the CPU copy into a staging buffer that limited uploads from RAM to a third of the bus.
#pragma once

#include <vulkan/vulkan.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "base/status.h"
#include "engine/vulkan/vulkan_context.h"

namespace kvtier {

// Thread-safe.
class HostMemoryImport {
 public:
  // nullptr when the device cannot import host memory (DeviceInfo::host_import_alignment == 0).
  static std::unique_ptr<HostMemoryImport> create(VulkanContext& ctx);
  ~HostMemoryImport();
  HostMemoryImport(const HostMemoryImport&) = delete;
  HostMemoryImport& operator=(const HostMemoryImport&) = delete;

  // Where host bytes [p, p + bytes) are, as a buffer the GPU can copy from and to.
  struct Region {
    VkBuffer buffer = VK_NULL_HANDLE;
    uint64_t offset = 0;
    uint64_t address = 0;  // the device address of the bytes, for kernels that read them in place
  };
  // nullopt when the bytes are not in a large-buffer chunk, or their chunk could not be imported
  // (an error the first time, logged here and counted by the caller; later calls just say
  // nullopt).
  Result<std::optional<Region>> locate(const void* p, uint64_t bytes);

  uint64_t imported_bytes() const;

 private:
  explicit HostMemoryImport(VulkanContext& ctx);
  struct Imported {
    VkBuffer buffer = VK_NULL_HANDLE;  // VK_NULL_HANDLE: the import failed, do not retry
    VkDeviceMemory memory = VK_NULL_HANDLE;
    uint64_t bytes = 0;
    uint64_t address = 0;  // of the buffer's start
  };
  Status import(const uint8_t* base, uint64_t bytes, Imported& out);

  VulkanContext& ctx_;
  PFN_vkGetMemoryHostPointerPropertiesEXT host_pointer_properties_ = nullptr;
  mutable std::mutex mu_;  // guards chunks_ and imported_bytes_
  std::map<const uint8_t*, Imported> chunks_;  // by chunk base
  uint64_t imported_bytes_ = 0;
};

}  // namespace kvtier
