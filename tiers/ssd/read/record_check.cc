#include "tiers/ssd/read/record_check.h"

namespace kvtier {

RecordCheck check_record(AlignedBuffer buffer, const IndexEntry& entry, const BlockRequest& request,
                         const LayoutRegistry& layouts, BlockCodec& codec) {
  RecordCheck out;
  const std::span<const uint8_t> frame(buffer.data(), entry.length);
  auto header = parse_frame_header(frame);
  if (!header.ok()) {
    out.fault = RecordFault::kChecksum;
    out.why = header.status().message();
    return out;
  }
  if (header->payload_checksum != entry.checksum) {
    out.fault = RecordFault::kChecksum;
    out.why = "record is not the one the index names (checksum differs)";
    return out;
  }
  auto block = codec.decode_owned(std::move(buffer), entry.length, layouts);
  if (!block.ok()) {
    const bool checksum = block.status().message().find("checksum") != std::string::npos;
    out.fault = checksum ? RecordFault::kChecksum : RecordFault::kDecode;
    out.why = block.status().message();
    return out;
  }
  const auto& tokens = block->identity().token_ids;
  if (block->hash() != request.hash || block->layout().fingerprint() != entry.layout_fingerprint ||
      tokens.size() != entry.token_count || !request.tokens_match(tokens)) {
    out.fault = RecordFault::kIdentity;
    out.why = "block's hash, tokens or layout differ from the request and its entry";
    return out;
  }
  out.block.emplace(std::move(block).value());
  return out;
}

}  // namespace kvtier
