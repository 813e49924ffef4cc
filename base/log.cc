#include "base/log.h"

#include <pthread.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <string>

#include <nlohmann/json.hpp>
#include <spdlog/formatter.h>

namespace kvtier {

namespace {

// JSON lines: every field escaped, and bytes that are not UTF-8 (a client's namespace can be
// anything) replaced, so each line parses whatever was logged.
class JsonLineFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    const auto since_epoch = msg.time.time_since_epoch();
    const std::time_t seconds = std::chrono::duration_cast<std::chrono::seconds>(since_epoch).count();
    const auto millis = std::chrono::duration_cast<std::chrono::milliseconds>(since_epoch).count() % 1000;
    std::tm local{};
    localtime_r(&seconds, &local);
    char stamp[40];
    const size_t n = std::strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &local);
    std::snprintf(stamp + n, sizeof(stamp) - n, ".%03d", static_cast<int>(millis));
    const nlohmann::ordered_json line{{"time", stamp},
                              {"level", spdlog::level::to_string_view(msg.level).data()},
                              {"thread", msg.thread_id},
                              {"msg", std::string(msg.payload.data(), msg.payload.size())}};
    const std::string text = line.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
    dest.append(text.data(), text.data() + text.size());
  }
  std::unique_ptr<spdlog::formatter> clone() const override { return std::make_unique<JsonLineFormatter>(); }
};

}  // namespace

bool init_logging(std::string_view level, LogFormat format) {
  auto lvl = spdlog::level::from_str(std::string(level));
  // from_str answers `off` for names it does not know; only accept `off` when asked for.
  if (lvl == spdlog::level::off && level != "off") return false;
  spdlog::set_level(lvl);
  if (format == LogFormat::kJson) {
    spdlog::set_formatter(std::make_unique<JsonLineFormatter>());
  } else {
    spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ [%t] %v");
  }
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
