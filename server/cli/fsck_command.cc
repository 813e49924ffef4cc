#include "server/cli/fsck_command.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>

#include "base/byte_size.h"
#include "base/log.h"
#include "tiers/ssd/ssd_fsck.h"

namespace kvtier {
namespace {

using Clock = std::chrono::steady_clock;

// Shows how far the check has come: on a terminal a bar redrawn at most ten times a second, else
// (a log, a pipe, a systemd unit) one line every `every`, so a check of a large directory says it
// is alive, how fast it reads and how long it has left.
class ProgressPrinter {
 public:
  ProgressPrinter(bool bar, std::chrono::milliseconds every) : bar_(bar), every_(every) {}

  void operator()(const FsckProgress& p) {
    const auto now = Clock::now();
    const bool done = p.entries_done == p.entries_total;
    if (!done && now - last_ < every_) return;
    last_ = now;
    const double seconds = std::chrono::duration<double>(now - start_).count();
    const double fraction = p.bytes_total ? static_cast<double>(p.bytes_done) / static_cast<double>(p.bytes_total)
                                          : (p.entries_total ? static_cast<double>(p.entries_done) / static_cast<double>(p.entries_total) : 1.0);
    const double rate = seconds > 0 ? static_cast<double>(p.bytes_done) / seconds : 0;
    char left[48] = "";
    if (!done && rate > 0) {
      std::snprintf(left, sizeof(left), ", about %.0f s left", static_cast<double>(p.bytes_total - p.bytes_done) / rate);
    }
    char text[256];
    std::snprintf(text, sizeof(text), "%5.1f%%  %llu/%llu entries, %s of %s checked, %.2f GB/s%s", 100 * fraction,
                  static_cast<unsigned long long>(p.entries_done), static_cast<unsigned long long>(p.entries_total),
                  format_byte_size(p.bytes_done).c_str(), format_byte_size(p.bytes_total).c_str(), rate / 1e9, left);
    if (bar_) {
      const int width = 30;
      const int filled = static_cast<int>(width * fraction);
      std::fprintf(stderr, "\r[%s%s] %s\033[K", std::string(filled, '#').c_str(), std::string(width - filled, ' ').c_str(),
                   text);
      if (done) std::fprintf(stderr, "\n");
    } else {
      std::fprintf(stderr, "kvtier-fsck: %s\n", text);
    }
    std::fflush(stderr);
  }

 private:
  const bool bar_;
  const std::chrono::milliseconds every_;
  const Clock::time_point start_ = Clock::now();
  Clock::time_point last_{};
};

}  // namespace

int run_fsck(const std::string& dir, bool repair, bool quiet, std::optional<double> progress_every_s) {
  init_logging("warn");

  FsckOptions options;
  options.repair = repair;
  if (!quiet) {
    const bool tty = ::isatty(STDERR_FILENO);
    const double every = progress_every_s.value_or(tty ? 0.1 : 5.0);
    options.progress = ProgressPrinter(tty && !progress_every_s,
                                       std::chrono::milliseconds(static_cast<int64_t>(every * 1000)));
  }
  auto report = fsck_ssd_dir(dir, options);
  if (!report.ok()) {
    std::cerr << "kvtier-fsck: " << report.status().to_string() << "\n";
    return 2;
  }
  const FsckReport& r = *report;
  std::cout << "segments        " << r.segments << " (" << format_byte_size(r.segment_bytes) << ")\n"
            << "entries         " << r.entries << "\n"
            << "ok              " << r.ok << " (" << format_byte_size(r.live_bytes) << ")\n"
            << "corrupt         " << r.corrupt << "\n"
            << "bad index value " << r.bad_index_values << "\n"
            << "missing segment " << r.missing_segment << "\n"
            << "orphaned bytes  " << r.orphaned_bytes << " (" << format_byte_size(r.orphaned_bytes) << ")\n"
            << "orphan files    " << r.orphan_files << "\n";
  if (repair) std::cout << "repaired        " << r.repaired << "\n";
  if (!quiet) {
    for (const std::string& p : r.problems) std::cout << "  " << p << "\n";
  }
  return r.clean() && r.orphan_files == 0 ? 0 : 1;
}

}  // namespace kvtier
