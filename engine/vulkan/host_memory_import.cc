#include "engine/vulkan/host_memory_import.h"

#include "base/log.h"
#include "base/memory/large_buffer_cache.h"

namespace kvtier {

namespace {
constexpr auto kHandleType = VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT;
}  // namespace

std::unique_ptr<HostMemoryImport> HostMemoryImport::create(VulkanContext& ctx) {
  if (ctx.info().host_import_alignment == 0) return nullptr;
  auto h = std::unique_ptr<HostMemoryImport>(new HostMemoryImport(ctx));
  if (h->host_pointer_properties_ == nullptr) return nullptr;
  return h;
}

HostMemoryImport::HostMemoryImport(VulkanContext& ctx) : ctx_(ctx) {
  host_pointer_properties_ = reinterpret_cast<PFN_vkGetMemoryHostPointerPropertiesEXT>(
      vkGetDeviceProcAddr(ctx.device(), "vkGetMemoryHostPointerPropertiesEXT"));
}

HostMemoryImport::~HostMemoryImport() {
  // The GPU is done with every chunk: transfers that used them were waited for.
  for (auto& [base, c] : chunks_) {
    if (c.buffer == VK_NULL_HANDLE) continue;
    vkDestroyBuffer(ctx_.device(), c.buffer, nullptr);
    vkFreeMemory(ctx_.device(), c.memory, nullptr);
    large_buffer_unhold_chunk(base);  // only now may the chunk's memory go
  }
}

Status HostMemoryImport::import(const uint8_t* base, uint64_t bytes, Imported& out) {
  const uint64_t align = ctx_.info().host_import_alignment;
  if (reinterpret_cast<uintptr_t>(base) % align != 0 || bytes % align != 0) {
    return failed_precondition("chunk is not aligned to the device's import alignment " + std::to_string(align));
  }
  VkDevice dev = ctx_.device();
  VkMemoryHostPointerPropertiesEXT hp{.sType = VK_STRUCTURE_TYPE_MEMORY_HOST_POINTER_PROPERTIES_EXT};
  if (VkResult r = host_pointer_properties_(dev, kHandleType, base, &hp); r != VK_SUCCESS) {
    return vk_status("vkGetMemoryHostPointerPropertiesEXT", r);
  }
  VkExternalMemoryBufferCreateInfo ext{.sType = VK_STRUCTURE_TYPE_EXTERNAL_MEMORY_BUFFER_CREATE_INFO};
  ext.handleTypes = kHandleType;
  VkBufferCreateInfo bci{.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  bci.pNext = &ext;
  bci.size = bytes;
  // With a device address, kernels read blocks where they lie (scatter_blocks_from.comp): one
  // launch over every block of an upload, however they are spread over the chunks.
  bci.usage = VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT |
              VK_BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT;
  bci.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  VkBuffer buffer = VK_NULL_HANDLE;
  if (VkResult r = vkCreateBuffer(dev, &bci, nullptr, &buffer); r != VK_SUCCESS) {
    return vk_status("vkCreateBuffer (imported host memory)", r);
  }
  VkMemoryRequirements req;
  vkGetBufferMemoryRequirements(dev, buffer, &req);
  // CPU writes must reach the GPU without a flush (and back without an invalidate): the bytes
  // are written through the program's own pointers, never through a Vulkan mapping.
  auto type = ctx_.memory_type(hp.memoryTypeBits & req.memoryTypeBits, VK_MEMORY_PROPERTY_HOST_COHERENT_BIT,
                               VK_MEMORY_PROPERTY_HOST_CACHED_BIT);
  if (!type.ok() || req.size > bytes) {
    vkDestroyBuffer(dev, buffer, nullptr);
    return type.ok() ? failed_precondition("the imported buffer needs more bytes than its chunk")
                     : type.status().with_context("host memory import");
  }
  VkImportMemoryHostPointerInfoEXT imp{.sType = VK_STRUCTURE_TYPE_IMPORT_MEMORY_HOST_POINTER_INFO_EXT};
  imp.handleType = kHandleType;
  imp.pHostPointer = const_cast<uint8_t*>(base);
  VkMemoryAllocateFlagsInfo flags{.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_FLAGS_INFO};
  flags.flags = VK_MEMORY_ALLOCATE_DEVICE_ADDRESS_BIT;
  imp.pNext = &flags;
  VkMemoryAllocateInfo mai{.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  mai.pNext = &imp;
  mai.allocationSize = bytes;
  mai.memoryTypeIndex = *type;
  VkDeviceMemory memory = VK_NULL_HANDLE;
  if (VkResult r = vkAllocateMemory(dev, &mai, nullptr, &memory); r != VK_SUCCESS) {
    vkDestroyBuffer(dev, buffer, nullptr);
    return vk_status("vkAllocateMemory (import of host memory)", r);
  }
  if (VkResult r = vkBindBufferMemory(dev, buffer, memory, 0); r != VK_SUCCESS) {
    vkDestroyBuffer(dev, buffer, nullptr);
    vkFreeMemory(dev, memory, nullptr);
    return vk_status("vkBindBufferMemory (imported host memory)", r);
  }
  VkBufferDeviceAddressInfo dai{.sType = VK_STRUCTURE_TYPE_BUFFER_DEVICE_ADDRESS_INFO};
  dai.buffer = buffer;
  out = Imported{buffer, memory, bytes, vkGetBufferDeviceAddress(dev, &dai)};
  return ok_status();
}

Result<std::optional<HostMemoryImport::Region>> HostMemoryImport::locate(const void* p, uint64_t bytes) {
  const LargeBufferChunk chunk = large_buffer_chunk(p);
  const auto* at = static_cast<const uint8_t*>(p);
  if (chunk.base == nullptr || at + bytes > chunk.base + chunk.bytes) return std::optional<Region>();
  std::lock_guard lock(mu_);
  auto it = chunks_.find(chunk.base);
  if (it == chunks_.end()) {
    // Held before the import, so the chunk cannot go while the device maps it (the caller's
    // buffer in it keeps it alive until here).
    large_buffer_hold_chunk(chunk.base);
    Imported imported;
    Status st = import(chunk.base, chunk.bytes, imported);
    if (!st.ok()) {
      large_buffer_unhold_chunk(chunk.base);
      chunks_.emplace(chunk.base, Imported{});  // not tried again: copied through staging
      spdlog::warn("gpu: importing {} MiB of host memory failed, its blocks go through staging: {}",
                   chunk.bytes >> 20, st.to_string());
      return st;
    }
    imported_bytes_ += chunk.bytes;
    it = chunks_.emplace(chunk.base, imported).first;
  }
  if (it->second.buffer == VK_NULL_HANDLE) return std::optional<Region>();
  const uint64_t offset = static_cast<uint64_t>(at - chunk.base);
  return std::optional<Region>(Region{it->second.buffer, offset, it->second.address + offset});
}

uint64_t HostMemoryImport::imported_bytes() const {
  std::lock_guard lock(mu_);
  return imported_bytes_;
}

}  // namespace kvtier
