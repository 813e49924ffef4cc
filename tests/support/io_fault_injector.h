// IoFaultInjector: makes the SSD tier's real I/O fail the way a failing disk does — an errno (EIO,
// ENOSPC) or a short count — for operations on files under a given path. It defines the weak hook
// of tiers/ssd/io/io_fault_seam.h, so only test binaries that use it carry it. It can also hold
// completions back, for a disk slow enough that work can be seen to overlap a read. The operation itself
// still runs: a short count makes the tier continue a transfer the kernel already completed (same
// bytes), an errno makes it drop a write that did reach the file, or distrust a read that worked.
#pragma once

#include <chrono>
#include <cstdint>
#include <limits>
#include <string>

#include "tiers/ssd/io/io_fault_seam.h"

namespace kvtier::testing {

struct IoFault {
  IoSite site = IoSite::kWrite;
  std::string path_prefix;  // only operations on files whose path starts with this
  int error = 5;            // EIO; 0 = report a short count instead (or, with a delay, nothing)
  uint64_t skip = 0;        // matching operations let through first
  uint64_t count = std::numeric_limits<uint64_t>::max();  // then this many are hit
  std::chrono::milliseconds delay{0};  // hold each hit operation's completion this long (a slow disk)
};

// One fault at a time, process-wide; thread-safe. Arm in a test, and disarm (or let the guard do
// it) before the tier's files go away.
class IoFaultInjector {
 public:
  static void arm(IoFault fault);
  static void disarm();
  // Operations hit since the last arm().
  static uint64_t hits();
};

class ScopedIoFault {
 public:
  explicit ScopedIoFault(IoFault fault) { IoFaultInjector::arm(std::move(fault)); }
  ~ScopedIoFault() { IoFaultInjector::disarm(); }
  ScopedIoFault(const ScopedIoFault&) = delete;
  ScopedIoFault& operator=(const ScopedIoFault&) = delete;
};

}  // namespace kvtier::testing
