// Opening an SSD tier's directory: created if need be and locked for this process; wiped first on
// request (--ssd-reset); its manifest read, or written for a directory that holds no kvtier data
// (one that holds data but no manifest is refused, not guessed at), checked against the options,
// and brought to know every layout this process may write. Segment files go to DIR/segments,
// with O_DIRECT where the file system takes it.
#pragma once

#include "base/status.h"
#include "tiers/ssd/index/ssd_manifest.h"
#include "tiers/ssd/io/dir_lock.h"
#include "tiers/ssd/ssd_state.h"

namespace kvtier {

struct SsdDirectory {
  DirLock lock;
  SsdManifest manifest;
};

// For state.options.dir; adds the manifest's layouts to state.layouts and may turn
// state.options.direct_io off.
Result<SsdDirectory> open_ssd_directory(SsdState& state);

}  // namespace kvtier
