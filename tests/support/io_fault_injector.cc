#include "tests/support/io_fault_injector.h"

#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <thread>

namespace kvtier {
namespace {

std::mutex mu;
std::optional<testing::IoFault> armed;
uint64_t seen = 0;  // matching operations since arm()
uint64_t hit = 0;

std::string path_of(int fd) {
  char buf[4096];
  const std::string link = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t n = ::readlink(link.c_str(), buf, sizeof(buf));
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

}  // namespace

int injected_io_result(IoSite site, int fd, uint64_t, uint64_t length, int result) {
  std::unique_lock lock(mu);
  if (!armed || armed->site != site || result < 0) return result;
  if (path_of(fd).rfind(armed->path_prefix, 0) != 0) return result;
  const uint64_t n = seen++;
  if (n < armed->skip || n - armed->skip >= armed->count) return result;
  if (armed->delay.count() > 0) {
    ++hit;
    const auto delay = armed->delay;
    const bool only_delay = armed->error == 0;
    lock.unlock();  // other threads' I/O goes on meanwhile
    std::this_thread::sleep_for(delay);
    if (only_delay) return result;
    lock.lock();
    if (!armed) return result;
  }
  if (armed->error != 0) {
    ++hit;
    return -armed->error;
  }
  // A short count on a 4 KiB boundary (O_DIRECT continues only from aligned offsets), and only
  // where there is more than one such unit to split.
  const uint64_t moved = std::min<uint64_t>(static_cast<uint64_t>(result), length);
  if (moved <= 4096) return result;
  ++hit;
  return static_cast<int>((moved / 2 + 4095) / 4096 * 4096);  // less than moved, at least 4 KiB
}

namespace testing {

void IoFaultInjector::arm(IoFault fault) {
  std::lock_guard lock(mu);
  armed = std::move(fault);
  seen = 0;
  hit = 0;
}

void IoFaultInjector::disarm() {
  std::lock_guard lock(mu);
  armed.reset();
}

uint64_t IoFaultInjector::hits() {
  std::lock_guard lock(mu);
  return hit;
}

}  // namespace testing
}  // namespace kvtier
