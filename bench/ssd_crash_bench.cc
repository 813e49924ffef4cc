// ssd_crash_bench: the long form of the kill -9 test. A child spills blocks as fast as it can and
// is killed at random moments; after each restart every indexed block must read back bit-exact or
// be quarantined. Prints the totals; exits non-zero if a single wrong block was served.
#include <iostream>

#include <CLI/CLI.hpp>

#include "base/log.h"
#include "bench/harness/bench_report.h"
#include "tests/support/temp_dir.h"
#include "tests/tiers/ssd/ssd_crash_driver.h"

using namespace kvtier;

int main(int argc, char** argv) {
  CLI::App app{"ssd_crash_bench: kill -9 while spilling, many times; count wrong blocks served"};
  testing::CrashOptions o;
  o.cycles = 200;
  o.child = KVTIER_SSD_CRASH_CHILD;
  std::string dir;
  app.add_option("--cycles", o.cycles, "Kill/restart cycles");
  app.add_option("--min-ms", o.min_run_ms, "Shortest run before the kill");
  app.add_option("--max-ms", o.max_run_ms, "Longest run before the kill");
  app.add_option("--dir", dir, "Cache directory (default: a fresh temporary one)");
  app.add_option("--child", o.child, "Path of ssd_crash_child");
  CLI11_PARSE(app, argc, argv);
  testing::TempDir tmp;
  o.dir = dir.empty() ? tmp.str() : dir;
  init_logging("error");

  const auto t0 = std::chrono::steady_clock::now();
  auto totals = testing::run_crash_cycles(o);
  if (!totals.ok()) {
    std::cerr << totals.status().to_string() << "\n";
    return 2;
  }
  bench::Report report("ssd_crash_bench: kill -9 while spilling",
                       {"cycles", "entries checked", "intact", "quarantined", "dropped at recovery",
                        "wrong blocks served", "seconds"});
  report.set_meta("machine", bench::machine_description());
  report.add_row({std::to_string(totals->cycles), std::to_string(totals->entries),
                  std::to_string(totals->intact), std::to_string(totals->quarantined),
                  std::to_string(totals->recovery_dropped), std::to_string(totals->wrong),
                  bench::fmt_double(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1)});
  report.add_note("entries are counted once per cycle (the same block is checked again after every kill)");
  report.print();
  report.write_json(bench::output_path("ssd_crash_bench.json"));
  return totals->wrong == 0 ? 0 : 1;
}
