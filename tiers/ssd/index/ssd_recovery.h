// Recovery of an SSD tier's directory at open: the index's segment records reconciled with the
// segment files on disk. The index itself is not loaded (its entries are checked when read); only
// segments whose records are damaged, whose files are missing, or whose files are shorter than
// their durable watermark get their entries dropped (synced), and files no record names (made by
// a writer that died before recording them) are removed. Every drop is counted.
#pragma once

#include "base/status.h"
#include "tiers/ssd/ssd_state.h"

namespace kvtier {

// Fills state.segments with the segments that survive; state.index is open.
Status recover_segments(SsdState& state);

}  // namespace kvtier
