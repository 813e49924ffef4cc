// Logging: spdlog with one process-wide setup, plus LogThrottle for events that can repeat
// thousands of times a second (drops, failed writes), so each is logged with its reason without
// flooding: the first occurrence at once, then one line per interval that says how many were
// folded into it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string_view>

#include <spdlog/spdlog.h>

namespace kvtier {

enum class LogFormat {
  kText,  // 2026-11-23T10:00:00.123 I [tid] message
  kJson,  // one JSON object a line: {"time", "level", "thread", "msg"}, for log shippers
};

// Sets the level ("trace", "debug", "info", "warn", "error", "off") and the line format.
// Returns false when the level name is unknown.
bool init_logging(std::string_view level, LogFormat format = LogFormat::kText);

// Names the calling thread (visible in top, gdb and perf); names are cut to 15 characters.
void name_this_thread(const char* name);

// Thread-safe.
class LogThrottle {
 public:
  explicit LogThrottle(std::chrono::milliseconds interval = std::chrono::seconds(1))
      : interval_(interval) {}

  // Returns the number of events suppressed since the last admitted one when this event should
  // be logged, or nullopt when it should only be counted.
  std::optional<uint64_t> admit();

  // When this event is admitted, logs the message at `level` followed by how many similar events
  // were folded into it ("... (3 similar suppressed)"); otherwise only counts it. The message is
  // formatted only when admitted.
  template <typename... Args>
  void log(spdlog::level::level_enum level, spdlog::format_string_t<Args...> fmt, Args&&... args) {
    if (auto n = admit()) {
      spdlog::log(level, "{} ({} similar suppressed)",
                  fmt::format(fmt, std::forward<Args>(args)...), *n);
    }
  }
  template <typename... Args>
  void info(spdlog::format_string_t<Args...> fmt, Args&&... args) {
    log(spdlog::level::info, fmt, std::forward<Args>(args)...);
  }
  template <typename... Args>
  void warn(spdlog::format_string_t<Args...> fmt, Args&&... args) {
    log(spdlog::level::warn, fmt, std::forward<Args>(args)...);
  }
  template <typename... Args>
  void error(spdlog::format_string_t<Args...> fmt, Args&&... args) {
    log(spdlog::level::err, fmt, std::forward<Args>(args)...);
  }

 private:
  const std::chrono::milliseconds interval_;
  std::mutex mu_;
  std::chrono::steady_clock::time_point last_{};
  bool logged_once_ = false;
  uint64_t suppressed_ = 0;
};

}  // namespace kvtier
