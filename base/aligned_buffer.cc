#include "base/aligned_buffer.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

namespace kvtier {

AlignedBuffer::AlignedBuffer(size_t size, size_t alignment, bool zeroed)
    : size_(size), alignment_(alignment) {
  if (size == 0) return;
  // aligned_alloc wants the size to be a multiple of the alignment.
  data_ = static_cast<uint8_t*>(std::aligned_alloc(alignment, align_up(size, alignment)));
  if (data_ == nullptr) throw std::bad_alloc();
  if (zeroed) std::memset(data_, 0, size);
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

AlignedBuffer::AlignedBuffer(AlignedBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      alignment_(o.alignment_) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& o) noexcept {
  if (this != &o) {
    std::free(data_);
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
