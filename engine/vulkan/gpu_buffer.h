// GpuBuffer: one Vulkan buffer with its own memory, addressable from shaders by a 64-bit device
// address. kvtier allocates few, large, long-lived buffers (the block pool's per-layer K/V
// arrays, staging rings, model weights): tens in total, far below any driver's allocation limit
// (4096), so each gets a dedicated allocation instead of going through a sub-allocator — nothing
// to fragment, and freeing a pool returns its memory at once. (Vulkan Memory Allocator is not in
// Debian.)
#pragma once

#include <vulkan/vulkan.h>

#include <algorithm>
#include <cstdint>
#include <span>

#include "base/status.h"
#include "engine/vulkan/vulkan_context.h"

namespace kvtier {

enum class MemoryKind {
  kDevice,    // device-local: kernels' data
  kUpload,    // host-visible, written by the CPU, read by the GPU
  kDownload,  // host-visible and cached, written by the GPU, read by the CPU
};

// Not thread-safe; movable.
class GpuBuffer {
 public:
  static Result<GpuBuffer> create(VulkanContext& ctx, uint64_t size, MemoryKind kind);
  GpuBuffer() = default;
  ~GpuBuffer();
  GpuBuffer(GpuBuffer&& o) noexcept;
  GpuBuffer& operator=(GpuBuffer&& o) noexcept;
  GpuBuffer(const GpuBuffer&) = delete;
  GpuBuffer& operator=(const GpuBuffer&) = delete;

  VkBuffer handle() const { return buffer_; }
  uint64_t size() const { return size_; }
  uint64_t address() const { return address_; }
  // The CPU's view of host-visible memory (nullptr for device memory that is not host-visible).
  uint8_t* mapped() const { return mapped_; }
  // For host-visible memory: make CPU writes visible to the GPU / GPU writes visible to the CPU
  // (no-ops on coherent memory).
  Status flush(uint64_t offset, uint64_t bytes) const;
  Status invalidate(uint64_t offset, uint64_t bytes) const;

 private:
  void release();
  VkDevice device_ = VK_NULL_HANDLE;
  VkBuffer buffer_ = VK_NULL_HANDLE;
  VkDeviceMemory memory_ = VK_NULL_HANDLE;
  uint64_t size_ = 0;
  uint64_t address_ = 0;
  uint8_t* mapped_ = nullptr;
  bool coherent_ = true;
};

// Copies host bytes into a buffer (directly when it is mapped, else through a temporary staging
// buffer and a transfer), and back. For tests, set-up and the occasional small copy; hot paths
// keep their own staging.
Status upload(VulkanContext& ctx, const GpuBuffer& dst, uint64_t offset, std::span<const uint8_t> bytes);
Status download(VulkanContext& ctx, const GpuBuffer& src, uint64_t offset, std::span<uint8_t> out);

// A new buffer holding `values` (at least 16 bytes, so an empty array still has an address).
template <typename T>
Result<GpuBuffer> upload_new(VulkanContext& ctx, std::span<const T> values,
                             MemoryKind kind = MemoryKind::kDevice) {
  const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(values.data()),
                                       values.size_bytes());
  KVTIER_ASSIGN_OR_RETURN(GpuBuffer b,
                          GpuBuffer::create(ctx, std::max<uint64_t>(16, bytes.size()), kind));
  KVTIER_RETURN_IF_ERROR(upload(ctx, b, 0, bytes));
  return b;
}

}  // namespace kvtier
