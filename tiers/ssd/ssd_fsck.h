// fsck for an SSD cache directory: checks every index entry against its record on disk exactly
// as the read path would (check_record), in disk order so a large directory reads sequentially,
// and accounts for every byte of every segment. With
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

// How far a check has come: entries and their record bytes (what it reads from disk).
struct FsckProgress {
  uint64_t entries_done = 0;
  uint64_t entries_total = 0;
  uint64_t bytes_done = 0;
  uint64_t bytes_total = 0;
};

struct FsckOptions {
  bool repair = false;
  // Called after every few entries and once at the end (the caller decides what to show when).
  std::function<void(const FsckProgress&)> progress;
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
