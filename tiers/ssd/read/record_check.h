// check_record: the one definition of "this record may be served" — shared by the read path and
// kvtier-fsck. A record passes when its frame header and payload checksums hold, the payload is
// the one its index entry names (entry checksum), the document decodes against its layout, and
// the block's hash, token count, tokens and layout agree with the entry and the request.
#pragma once

#include <optional>
#include <span>
#include <string>

#include "serialize/format/block_codec.h"
#include "tiers/ssd/index/ssd_index.h"
#include "tiers/tier.h"

namespace kvtier {

enum class RecordFault { kNone, kChecksum, kDecode, kIdentity };

struct RecordCheck {
  RecordFault fault = RecordFault::kNone;
  std::string why;             // for logs and fsck output
  std::optional<Block> block;  // set when fault == kNone
};

// `buffer` holds the record (at least entry.length bytes); a block that passes keeps it as its
// storage instead of copying its tensors out.
RecordCheck check_record(AlignedBuffer buffer, const IndexEntry& entry, const BlockRequest& request,
                         const LayoutRegistry& layouts, BlockCodec& codec);

}  // namespace kvtier
