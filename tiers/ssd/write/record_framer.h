// RecordFramer: a spill item as the record the SSD tier writes — its frame (serialize/format/
// frame.h) padded to whole O_DIRECT units with zeros, so no stale heap bytes reach the disk.
// Uncompressed, the frame is made in place: only the header bytes in front of the document and
// the padding after it are written (readers may be decoding the document meanwhile). Compressed,
// it goes into a buffer of its own. A record moved out of a reclaimed segment keeps its frame.
// The writer thread's: not thread-safe.
#pragma once

#include "base/memory/aligned_buffer.h"
#include "base/status.h"
#include "serialize/format/frame.h"
#include "tiers/ssd/write/spill_queue.h"

namespace kvtier {

struct FramedRecord {
  FrameHeader header;
  AlignedBuffer compressed;  // the frame, when it is not in the item's own buffer
};

class RecordFramer {
 public:
  explicit RecordFramer(FrameCodec codec) : codec_(codec) {}
  // Sets item.frame_size.
  Result<FramedRecord> frame(SpillItem& item);

 private:
  FrameCodec codec_;
  FrameWriter writer_;
};

}  // namespace kvtier
