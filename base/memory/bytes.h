// Bytes: a growable byte buffer whose resize() does not zero the new bytes. Frames and documents
// are resized and then overwritten in full; zeroing 2 MiB first costs as much as the copy itself.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace kvtier {

template <typename T>
struct DefaultInitAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = DefaultInitAllocator<U>;
  };
  using std::allocator<T>::allocator;
  template <typename U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;  // default-init: no zeroing
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

using Bytes = std::vector<uint8_t, DefaultInitAllocator<uint8_t>>;

}  // namespace kvtier
