#include "tiers/ssd/io/dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <string>

namespace kvtier {

Result<DirLock> DirLock::acquire(const std::string& dir) {
  const std::string path = dir + "/LOCK";
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!fd.valid()) return errno_status("open " + path, errno);
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err != EWOULDBLOCK) return errno_status("lock " + path, err);
    char pid[32] = {};
    ssize_t n = ::pread(fd.get(), pid, sizeof(pid) - 1, 0);
    std::string holder = n > 0 ? std::string(pid, static_cast<size_t>(n)) : "unknown";
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    return failed_precondition("cache directory " + dir + " is in use by another process (pid " +
                               holder + ")");
  }
  const std::string me = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd.get(), 0) != 0 || ::pwrite(fd.get(), me.data(), me.size(), 0) < 0) {
    return errno_status("write pid to " + path, errno);
  }
  return DirLock(std::move(fd));
}

}  // namespace kvtier
