#include "base/memory/aligned_buffer.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "base/memory/large_buffer_cache.h"

namespace kvtier {

namespace {
bool is_large(size_t size, size_t alignment) {
  return size >= kLargeBufferThreshold && alignment <= 4096;
}
}  // namespace

AlignedBuffer::AlignedBuffer(size_t size, size_t alignment, bool zeroed)
    : size_(size), alignment_(alignment) {
  if (size == 0) return;
  if (is_large(size, alignment)) {
    bool fresh = false;
    data_ = static_cast<uint8_t*>(large_buffer_acquire(size, &fresh));
    if (data_ == nullptr) throw std::bad_alloc();
    if (zeroed && !fresh) std::memset(data_, 0, size);
    return;
  }
  // aligned_alloc wants the size to be a multiple of the alignment.
  data_ = static_cast<uint8_t*>(alignment == 4096 ? small_page_buffer_acquire(size)
                                                  : std::aligned_alloc(alignment, align_up(size, alignment)));
  if (data_ == nullptr) throw std::bad_alloc();
  if (zeroed) std::memset(data_, 0, size);
}

AlignedBuffer::~AlignedBuffer() { release(); }

void AlignedBuffer::release() {
  if (data_ == nullptr) return;
  if (is_large(size_, alignment_)) {
    large_buffer_release(data_, size_);
  } else if (alignment_ == 4096) {
    small_page_buffer_release(data_, size_);
  } else {
    std::free(data_);
  }
  data_ = nullptr;
  size_ = 0;
}

AlignedBuffer::AlignedBuffer(AlignedBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      alignment_(o.alignment_) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& o) noexcept {
  if (this != &o) {
    release();
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    alignment_ = o.alignment_;
  }
  return *this;
}

AlignedBuffer AlignedBuffer::clone() const {
  AlignedBuffer copy(size_, alignment_, /*zeroed=*/false);
  if (size_) std::memcpy(copy.data_, data_, size_);
  return copy;
}

}  // namespace kvtier
