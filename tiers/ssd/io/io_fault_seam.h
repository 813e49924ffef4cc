// The seam through which tests make the SSD tier's I/O fail (EIO, ENOSPC, short counts) at the
// exact places where a real disk fails it. No production binary defines the hook: it is a weak
// symbol, so there each call is one test of a null address. Tests link
// tests/support/io_fault_injector.cc, which defines it and decides what fails.
#pragma once

#include <cstdint>

namespace kvtier {

enum class IoSite { kRead, kWrite, kDataSync, kAllocate };

// Defined only in test binaries. Given an operation that completed with `result` (bytes moved, or
// -errno), returns what the operation should report instead.
[[gnu::weak]] int injected_io_result(IoSite site, int fd, uint64_t offset, uint64_t length, int result);

inline int io_result(IoSite site, int fd, uint64_t offset, uint64_t length, int result) {
  if (injected_io_result == nullptr) return result;
  return injected_io_result(site, fd, offset, length, result);
}

}  // namespace kvtier
