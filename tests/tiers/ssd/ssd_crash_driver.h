// The kill -9 experiment, shared by the short test in `make test` and the long program in bench/:
// a child process spills blocks as fast as it can and is killed at a random moment; the parent
// reopens the directory and reads every indexed entry back. Each must be bit-exact (checked
// against the block its tokens say it is) or be quarantined; a wrong block served is a failure.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"
#include "serialize/kv_layout.h"
#include "tiers/ssd/ssd_options.h"

namespace kvtier::testing {

// The layout and tier settings both sides use: small records, small segments, so that segments
// fill, get reclaimed, and records straddle the kill at every stage.
std::shared_ptr<const KvLayout> crash_layout();
SsdTierOptions crash_tier_options(const std::string& dir);

struct CrashOptions {
  std::string child;  // path of the ssd_crash_child program
  std::string dir;
  int cycles = 20;
  int min_run_ms = 30;
  int max_run_ms = 300;
  uint64_t seed = 1;
};

struct CrashTotals {
  int cycles = 0;
  uint64_t entries = 0;      // entries found in the index after the kills, summed over cycles
  uint64_t intact = 0;       // read back bit-exact
  uint64_t quarantined = 0;  // failed a check: removed, not served
  uint64_t wrong = 0;        // served but not the block it claims to be: must stay 0
  uint64_t recovery_dropped = 0;
  uint64_t written_by_children = 0;  // highest seed reached, summed: blocks attempted
};

Result<CrashTotals> run_crash_cycles(const CrashOptions& options);

}  // namespace kvtier::testing
