// fsck for an SSD cache directory: checks every index entry against its record on disk exactly
// as the read path would (check_record), and accounts for every byte of every segment. With
// repair, entries that fail are removed (the read path would quarantine them anyway) and segment
// records are corrected. Without it, nothing is changed. Needs the directory unlocked (no server
// running on it).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/status.h"

namespace kvtier {

struct FsckOptions {
  bool repair = false;
  // Called now and then with entries checked so far and the total.
  std::function<void(uint64_t done, uint64_t total)> progress;
};

struct FsckReport {
  uint64_t segments = 0;
  uint64_t segment_bytes = 0;    // allocated on disk
  uint64_t entries = 0;
  uint64_t ok = 0;
  uint64_t corrupt = 0;          // record fails a check (checksum, document, identity, bounds)
  uint64_t bad_index_values = 0; // index values that cannot be decoded
  uint64_t missing_segment = 0;  // entry names a segment that does not exist
  uint64_t live_bytes = 0;       // padded bytes of the records that pass
  uint64_t orphaned_bytes = 0;   // segment bytes no passing entry accounts for
  uint64_t orphan_files = 0;     // segment files no record names
  uint64_t repaired = 0;         // entries removed (repair only)
  std::vector<std::string> problems;  // the first 100, one line each

  bool clean() const { return corrupt == 0 && bad_index_values == 0 && missing_segment == 0; }
};

Result<FsckReport> fsck_ssd_dir(const std::string& dir, const FsckOptions& options);

}  // namespace kvtier
