// The fsck command shared by `kvtier fsck` and `kvtier-fsck`: checks (and with repair, fixes)
// a stopped server's SSD directory and prints the report. Exit status: 0 clean, 1 problems
// found (repaired or not), 2 the check itself could not run.
#pragma once

#include <optional>
#include <string>

namespace kvtier {

// Progress goes to stderr: a bar on a terminal, else a line every 5 s; `progress_every_s` sets
// the interval and asks for lines even on a terminal; `quiet` shows none.
int run_fsck(const std::string& dir, bool repair, bool quiet, std::optional<double> progress_every_s = std::nullopt);

}  // namespace kvtier
