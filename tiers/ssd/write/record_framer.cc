#include "tiers/ssd/write/record_framer.h"

#include <cstring>

#include "tiers/ssd/ssd_state.h"

namespace kvtier {

Result<FramedRecord> RecordFramer::frame(SpillItem& item) {
  FramedRecord out;
  if (item.preframed) {
    KVTIER_ASSIGN_OR_RETURN(out.header, parse_frame_header(item.buffer.span()));
    item.frame_size = out.header.frame_size();
    return out;
  }
  std::span<uint8_t> buf = item.buffer.span();
  if (codec_ == FrameCodec::kNone) {
    out.header = frame_in_place(buf, item.document_size);
  } else {
    const auto doc = std::span<const uint8_t>(buf.data() + kFrameHeaderSize, item.document_size);
    AlignedBuffer framed(record_padded(max_frame_size(item.document_size, codec_)), kRecordAlign, /*zeroed=*/false);
    KVTIER_ASSIGN_OR_RETURN(out.header, writer_.write(doc, codec_, item.shuffle_width, framed.span()));
    out.compressed = std::move(framed);
  }
  const size_t end = out.header.frame_size();
  uint8_t* base = out.compressed.empty() ? item.buffer.data() : out.compressed.data();
  std::memset(base + end, 0, record_padded(end) - end);
  item.frame_size = end;
  return out;
}

}  // namespace kvtier
