// kvtier-fsck DIR [--repair]: checks every block of an SSD cache directory as the read path would
// and accounts for every byte of its segments. Exit status: 0 clean, 1 problems found (repaired
// or not), 2 the check itself could not run.
#include <CLI/CLI.hpp>

#include <optional>

#include "base/build_info.h"
#include "server/cli/fsck_command.h"

using namespace kvtier;

int main(int argc, char** argv) {
  CLI::App app{"kvtier-fsck: check (and optionally repair) a kvtier SSD cache directory"};
  app.set_version_flag("--version", version_text("kvtier-fsck"));
  std::string dir;
  bool repair = false;
  bool quiet = false;
  app.add_option("dir", dir, "The --ssd-cache-dir of a stopped kvtierd")->required();
  app.add_flag("--repair", repair, "Remove entries that fail their checks and fix segment records");
  app.add_flag("-q,--quiet", quiet, "No progress, no problem list");
  std::optional<double> every;
  app.add_option("--progress-every", every,
                 "Seconds between progress lines on stderr (default: a bar on a terminal, else a line every 5 s)")
      ->check(CLI::Range(0.0, 3600.0));
  CLI11_PARSE(app, argc, argv);
  return run_fsck(dir, repair, quiet, every);
}
