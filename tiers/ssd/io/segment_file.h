// SegmentFile: one preallocated, append-only file of the SSD tier, opened for O_DIRECT I/O.
// Segments are never reused in place: a reclaimed segment is unlinked, and readers that still hold
// it (shared_ptr) keep reading the old inode safely.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"
#include "base/unique_fd.h"

namespace kvtier {

// Immutable after open; the fd is used concurrently by the writer and readers (pread/pwrite-style
// I/O through io_uring needs no shared file offset).
class SegmentFile {
 public:
  // Creates the file and reserves `size` bytes with fallocate (ENOSPC surfaces here, as kNoSpace).
  // With `direct_io` the file is opened O_DIRECT; where the file system refuses O_DIRECT (EINVAL)
  // the caller decides whether to fall back (see SsdTierOptions::direct_io).
  static Result<std::shared_ptr<SegmentFile>> create(const std::string& path, uint64_t id,
                                                     uint64_t size, bool direct_io);
  static Result<std::shared_ptr<SegmentFile>> open_existing(const std::string& path, uint64_t id,
                                                            bool direct_io);

  uint64_t id() const { return id_; }
  int fd() const { return fd_.get(); }
  const std::string& path() const { return path_; }
  // Size on disk when opened or created.
  uint64_t size() const { return size_; }
  bool direct_io() const { return direct_io_; }

  // "seg-00000000000000a1.kvs"
  static std::string file_name(uint64_t id);
  // Parses a file name written by file_name(); false for anything else.
  static bool parse_file_name(const std::string& name, uint64_t& id);

 private:
  SegmentFile(std::string path, uint64_t id, UniqueFd fd, uint64_t size, bool direct_io)
      : path_(std::move(path)), id_(id), fd_(std::move(fd)), size_(size), direct_io_(direct_io) {}
  std::string path_;
  uint64_t id_;
  UniqueFd fd_;
  uint64_t size_;
  bool direct_io_;
};

}  // namespace kvtier
