#include "tiers/ssd/io/segment_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "tiers/ssd/io/io_fault_seam.h"

namespace kvtier {

std::string SegmentFile::file_name(uint64_t id) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "seg-%016llx.kvs", static_cast<unsigned long long>(id));
  return buf;
}

bool SegmentFile::parse_file_name(const std::string& name, uint64_t& id) {
  if (name.size() != 24 || name.rfind("seg-", 0) != 0 || name.substr(20) != ".kvs") return false;
  unsigned long long v = 0;
  for (size_t i = 4; i < 20; ++i) {
    const char c = name[i];
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return false;
    v = v << 4 | static_cast<unsigned>(d);
  }
  id = v;
  return true;
}

Result<std::shared_ptr<SegmentFile>> SegmentFile::create(const std::string& path, uint64_t id,
                                                         uint64_t size, bool direct_io) {
  const int flags = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | (direct_io ? O_DIRECT : 0);
  UniqueFd fd(::open(path.c_str(), flags, 0644));
  if (!fd.valid()) return errno_status("create segment " + path, errno);
  const int rc = ::fallocate(fd.get(), 0, 0, static_cast<off_t>(size)) == 0 ? 0 : -errno;
  if (const int res = io_result(IoSite::kAllocate, fd.get(), 0, size, rc); res < 0) {
    const int err = -res;
    ::unlink(path.c_str());  // leave nothing half-made
    return errno_status("fallocate " + std::to_string(size) + " bytes for segment " + path, err);
  }
  return std::shared_ptr<SegmentFile>(new SegmentFile(path, id, std::move(fd), size, direct_io));
}

Result<std::shared_ptr<SegmentFile>> SegmentFile::open_existing(const std::string& path,
                                                                uint64_t id, bool direct_io) {
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC | (direct_io ? O_DIRECT : 0)));
  if (!fd.valid()) return errno_status("open segment " + path, errno);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return errno_status("stat segment " + path, errno);
  return std::shared_ptr<SegmentFile>(
      new SegmentFile(path, id, std::move(fd), static_cast<uint64_t>(st.st_size), direct_io));
}

}  // namespace kvtier
