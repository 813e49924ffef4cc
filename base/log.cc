#include "base/log.h"

#include <pthread.h>

#include <string>

namespace kvtier {

bool init_logging(std::string_view level) {
  auto lvl = spdlog::level::from_str(std::string(level));
  // from_str answers `off` for names it does not know; only accept `off` when asked for.
  if (lvl == spdlog::level::off && level != "off") return false;
  spdlog::set_level(lvl);
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ [%t] %v");
  return true;
}

void name_this_thread(const char* name) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%s", name);
  pthread_setname_np(pthread_self(), buf);
}

std::optional<uint64_t> LogThrottle::admit() {
  std::lock_guard lock(mu_);
  auto now = std::chrono::steady_clock::now();
  if (logged_once_ && now - last_ < interval_) {
    ++suppressed_;
    return std::nullopt;
  }
  logged_once_ = true;
  last_ = now;
  uint64_t n = suppressed_;
  suppressed_ = 0;
  return n;
}

}  // namespace kvtier
