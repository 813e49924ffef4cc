// DirLock: an exclusive lock on a cache directory (flock on DIR/LOCK), so two processes can never
// write one SSD tier. The kernel drops the lock when the process dies, kill -9 included.
#pragma once

#include <string>

#include "base/status.h"
#include "base/unique_fd.h"

namespace kvtier {

class DirLock {
 public:
  // kFailedPrecondition naming the holder's pid when another process holds the lock.
  static Result<DirLock> acquire(const std::string& dir);
  DirLock(DirLock&&) = default;
  DirLock& operator=(DirLock&&) = default;

 private:
  explicit DirLock(UniqueFd fd) : fd_(std::move(fd)) {}
  UniqueFd fd_;
};

}  // namespace kvtier
