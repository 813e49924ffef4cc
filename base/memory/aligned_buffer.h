// AlignedBuffer: an owned, aligned byte buffer. O_DIRECT I/O needs 4 KiB-aligned memory, and
// block tensors are kept 64-byte aligned so copies and vector loads run at full speed. Buffers of
// 16 KiB and more come from LargeBufferCache (page aligned, recycled; see large_buffer_cache.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace kvtier {

// Not thread-safe; movable, not copyable (copy explicitly with clone()).
class AlignedBuffer {
 public:
  static constexpr size_t kDefaultAlignment = 64;

  AlignedBuffer() = default;
  // Allocates `size` bytes aligned to `alignment` (a power of two). The bytes are zeroed when
  // `zeroed` is true, left as they are otherwise (for buffers that are about to be overwritten).
  explicit AlignedBuffer(size_t size, size_t alignment = kDefaultAlignment, bool zeroed = true);
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  AlignedBuffer clone() const;

  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  size_t alignment() const { return alignment_; }
  bool empty() const { return size_ == 0; }
  std::span<uint8_t> span() { return {data_, size_}; }
  std::span<const uint8_t> span() const { return {data_, size_}; }

 private:
  void release();
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  size_t alignment_ = kDefaultAlignment;
};

inline constexpr uint64_t align_up(uint64_t v, uint64_t alignment) {
  return (v + alignment - 1) / alignment * alignment;
}

}  // namespace kvtier
