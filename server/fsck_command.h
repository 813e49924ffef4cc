// The fsck command shared by `kvtier fsck` and `kvtier-fsck`: checks (and with repair, fixes)
// a stopped server's SSD directory and prints the report. Exit status: 0 clean, 1 problems
// found (repaired or not), 2 the check itself could not run.
#pragma once

#include <string>

namespace kvtier {

int run_fsck(const std::string& dir, bool repair, bool quiet);

}  // namespace kvtier
