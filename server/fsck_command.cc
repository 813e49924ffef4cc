#include "server/fsck_command.h"

#include <unistd.h>

#include <cstdio>
#include <iostream>

#include "base/byte_size.h"
#include "base/log.h"
#include "tiers/ssd/ssd_fsck.h"

namespace kvtier {

int run_fsck(const std::string& dir, bool repair, bool quiet) {
  init_logging("warn");

  FsckOptions options;
  options.repair = repair;
  const bool tty = ::isatty(STDERR_FILENO) && !quiet;
  if (tty) {
    options.progress = [](uint64_t done, uint64_t total) {
      const int width = 40;
      const int filled = total ? static_cast<int>(width * done / total) : width;
      std::fprintf(stderr, "\r[%s%s] %llu/%llu entries", std::string(filled, '#').c_str(),
                   std::string(width - filled, ' ').c_str(), static_cast<unsigned long long>(done),
                   static_cast<unsigned long long>(total));
      std::fflush(stderr);
    };
  }
  auto report = fsck_ssd_dir(dir, options);
  if (tty) std::fprintf(stderr, "\n");
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
