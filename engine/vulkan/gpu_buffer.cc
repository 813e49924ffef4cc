#include "engine/vulkan/gpu_buffer.h"

#include <cstring>
#include <utility>

#include "engine/vulkan/command_batch.h"

namespace kvtier {

Result<GpuBuffer> GpuBuffer::create(VulkanContext& ctx, uint64_t size, MemoryKind kind) {
  if (size == 0) return invalid_argument("GPU buffer of 0 bytes");
  GpuBuffer b;
  b.device_ = ctx.device();
  b.size_ = size;
  VkBufferCreateInfo bi{.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  bi.size = size;
  bi.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
             VK_BUFFER_USAGE_TRANSFER_DST_BIT | VK_BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT;
  bi.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  if (VkResult r = vkCreateBuffer(b.device_, &bi, nullptr, &b.buffer_); r != VK_SUCCESS) {
    return vk_status("vkCreateBuffer", r);
  }
  VkMemoryRequirements req;
  vkGetBufferMemoryRequirements(b.device_, b.buffer_, &req);
  VkMemoryPropertyFlags required = 0, preferred = 0;
  switch (kind) {
    case MemoryKind::kDevice:
      required = VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT;
      break;
    case MemoryKind::kUpload:
      required = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT;
      preferred = VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
      break;
    case MemoryKind::kDownload:
      required = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT;
      preferred = VK_MEMORY_PROPERTY_HOST_CACHED_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
      break;
  }
  KVTIER_ASSIGN_OR_RETURN(uint32_t type, ctx.memory_type(req.memoryTypeBits, required, preferred));
  VkMemoryAllocateFlagsInfo flags{.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_FLAGS_INFO};
  flags.flags = VK_MEMORY_ALLOCATE_DEVICE_ADDRESS_BIT;
  VkMemoryAllocateInfo ai{.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  ai.pNext = &flags;
  ai.allocationSize = req.size;
  ai.memoryTypeIndex = type;
  if (VkResult r = vkAllocateMemory(b.device_, &ai, nullptr, &b.memory_); r != VK_SUCCESS) {
    return vk_status(("vkAllocateMemory(" + std::to_string(size) + " bytes)").c_str(), r);
  }
  if (VkResult r = vkBindBufferMemory(b.device_, b.buffer_, b.memory_, 0); r != VK_SUCCESS) {
    return vk_status("vkBindBufferMemory", r);
  }
  VkBufferDeviceAddressInfo dai{.sType = VK_STRUCTURE_TYPE_BUFFER_DEVICE_ADDRESS_INFO};
  dai.buffer = b.buffer_;
  b.address_ = vkGetBufferDeviceAddress(b.device_, &dai);
  VkPhysicalDeviceMemoryProperties mp;
  vkGetPhysicalDeviceMemoryProperties(ctx.physical_device(), &mp);
  const VkMemoryPropertyFlags got = mp.memoryTypes[type].propertyFlags;
  if (got & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) {
    void* p = nullptr;
    if (VkResult r = vkMapMemory(b.device_, b.memory_, 0, VK_WHOLE_SIZE, 0, &p); r != VK_SUCCESS) {
      return vk_status("vkMapMemory", r);
    }
    b.mapped_ = static_cast<uint8_t*>(p);
    b.coherent_ = got & VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
  }
  return b;
}

void GpuBuffer::release() {
  if (device_ == VK_NULL_HANDLE) return;
  if (mapped_) vkUnmapMemory(device_, memory_);
  if (buffer_) vkDestroyBuffer(device_, buffer_, nullptr);
  if (memory_) vkFreeMemory(device_, memory_, nullptr);
  device_ = VK_NULL_HANDLE;
  buffer_ = VK_NULL_HANDLE;
  memory_ = VK_NULL_HANDLE;
  mapped_ = nullptr;
}

GpuBuffer::~GpuBuffer() { release(); }

GpuBuffer::GpuBuffer(GpuBuffer&& o) noexcept
    : device_(std::exchange(o.device_, VK_NULL_HANDLE)),
      buffer_(std::exchange(o.buffer_, VK_NULL_HANDLE)),
      memory_(std::exchange(o.memory_, VK_NULL_HANDLE)),
      size_(std::exchange(o.size_, 0)),
      address_(std::exchange(o.address_, 0)),
      mapped_(std::exchange(o.mapped_, nullptr)),
      coherent_(o.coherent_) {}

GpuBuffer& GpuBuffer::operator=(GpuBuffer&& o) noexcept {
  if (this != &o) {
    release();
    device_ = std::exchange(o.device_, VK_NULL_HANDLE);
    buffer_ = std::exchange(o.buffer_, VK_NULL_HANDLE);
    memory_ = std::exchange(o.memory_, VK_NULL_HANDLE);
    size_ = std::exchange(o.size_, 0);
    address_ = std::exchange(o.address_, 0);
    mapped_ = std::exchange(o.mapped_, nullptr);
    coherent_ = o.coherent_;
  }
  return *this;
}

Status GpuBuffer::flush(uint64_t offset, uint64_t bytes) const {
  if (coherent_ || !mapped_) return ok_status();
  VkMappedMemoryRange r{.sType = VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE};
  r.memory = memory_;
  r.offset = offset / 256 * 256;  // nonCoherentAtomSize is at most 256
  r.size = VK_WHOLE_SIZE;
  (void)bytes;
  if (VkResult res = vkFlushMappedMemoryRanges(device_, 1, &r); res != VK_SUCCESS) {
    return vk_status("vkFlushMappedMemoryRanges", res);
  }
  return ok_status();
}

Status GpuBuffer::invalidate(uint64_t offset, uint64_t bytes) const {
  if (coherent_ || !mapped_) return ok_status();
  VkMappedMemoryRange r{.sType = VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE};
  r.memory = memory_;
  r.offset = offset / 256 * 256;
  r.size = VK_WHOLE_SIZE;
  (void)bytes;
  if (VkResult res = vkInvalidateMappedMemoryRanges(device_, 1, &r); res != VK_SUCCESS) {
    return vk_status("vkInvalidateMappedMemoryRanges", res);
  }
  return ok_status();
}

Status upload(VulkanContext& ctx, const GpuBuffer& dst, uint64_t offset, std::span<const uint8_t> bytes) {
  if (bytes.empty()) return ok_status();
  if (offset + bytes.size() > dst.size()) return invalid_argument("upload past the buffer's end");
  if (dst.mapped()) {
    std::memcpy(dst.mapped() + offset, bytes.data(), bytes.size());
    return dst.flush(offset, bytes.size());
  }
  KVTIER_ASSIGN_OR_RETURN(GpuBuffer staging, GpuBuffer::create(ctx, bytes.size(), MemoryKind::kUpload));
  std::memcpy(staging.mapped(), bytes.data(), bytes.size());
  KVTIER_RETURN_IF_ERROR(staging.flush(0, bytes.size()));
  KVTIER_ASSIGN_OR_RETURN(CommandBatch batch, CommandBatch::begin(ctx));
  batch.copy(staging, 0, dst, offset, bytes.size());
  return batch.submit_and_wait();
}

Status download(VulkanContext& ctx, const GpuBuffer& src, uint64_t offset, std::span<uint8_t> out) {
  if (out.empty()) return ok_status();
  if (offset + out.size() > src.size()) return invalid_argument("download past the buffer's end");
  if (src.mapped()) {
    KVTIER_RETURN_IF_ERROR(src.invalidate(offset, out.size()));
    std::memcpy(out.data(), src.mapped() + offset, out.size());
    return ok_status();
  }
  KVTIER_ASSIGN_OR_RETURN(GpuBuffer staging, GpuBuffer::create(ctx, out.size(), MemoryKind::kDownload));
  KVTIER_ASSIGN_OR_RETURN(CommandBatch batch, CommandBatch::begin(ctx));
  batch.copy(src, offset, staging, 0, out.size());
  KVTIER_RETURN_IF_ERROR(batch.submit_and_wait());
  KVTIER_RETURN_IF_ERROR(staging.invalidate(0, out.size()));
  std::memcpy(out.data(), staging.mapped(), out.size());
  return ok_status();
}

}  // namespace kvtier
