#include "serialize/format/block_codec.h"

#include <algorithm>
#include <optional>

namespace kvtier {

Status BlockCodec::encode_document(const Block& block, Bytes& out) {
  if (block.any_quantized()) return encode_block_document(block.dequantized(), out);
  return encode_block_document(block, out);
}

uint8_t BlockCodec::shuffle_width_for(const KvLayout& layout) {
  return static_cast<uint8_t>(dtype_size(layout.layers.front().dtype));
}

Status BlockCodec::encode(const Block& block, Bytes& out) {
  std::optional<Block> expanded;
  if (block.any_quantized()) expanded.emplace(block.dequantized());
  const Block& dense = expanded ? *expanded : block;
  KVTIER_ASSIGN_OR_RETURN(std::string header, block_document_header(dense));
  const size_t doc_size = block_document_size(dense, header);
  if (doc_size > kMaxFrameRawLength) {
    return invalid_argument("block of " + std::to_string(doc_size) + " bytes exceeds the frame limit");
  }
  if (codec_ == FrameCodec::kNone) {
    // The document goes straight into the frame, checksummed as it is copied.
    out.resize(kFrameHeaderSize + doc_size);
    Checksum64 sum;
    write_block_document(dense, header, out.data() + kFrameHeaderSize, &sum);
    write_frame_header({FrameCodec::kNone, 0, doc_size, doc_size, sum.digest()}, out.data());
    return ok_status();
  }
  document_.resize(doc_size);
  write_block_document(dense, header, document_.data(), nullptr);
  out.resize(max_frame_size(doc_size, codec_));
  KVTIER_ASSIGN_OR_RETURN(
      FrameHeader h, writer_.write(document_, codec_, shuffle_width_for(dense.layout()), out));
  out.resize(h.frame_size());
  return ok_status();
}

Result<Block> BlockCodec::decode(std::span<const uint8_t> frame, const LayoutRegistry& layouts) {
  FrameHeader h;
  KVTIER_ASSIGN_OR_RETURN(std::span<const uint8_t> payload, reader_.open_unverified(frame, h));
  if (h.codec != FrameCodec::kNone) {
    KVTIER_ASSIGN_OR_RETURN(std::span<const uint8_t> doc, reader_.open(frame));
    return decode_block_document(doc, layouts);
  }
  // Uncompressed: verify the checksum while the data is copied into the block. Corrupt bytes may
  // reach the (fuzzed) document parser first; the checksum still decides what is reported, so a
  // damaged record always reads as a checksum mismatch.
  Checksum64 sum;
  Result<Block> block = decode_block_document(payload, layouts, &sum);
  const bool intact = block.ok() ? sum.digest() == h.payload_checksum
                                 : checksum64(payload.data(), payload.size()) == h.payload_checksum;
  if (!intact) return corruption("frame: payload checksum mismatch");
  return block;
}

}  // namespace kvtier

namespace kvtier {

Result<Block> BlockCodec::decode_owned(AlignedBuffer buffer, size_t frame_length, const LayoutRegistry& layouts) {
  const std::span<const uint8_t> frame(buffer.data(), std::min(frame_length, buffer.size()));
  FrameHeader h;
  KVTIER_ASSIGN_OR_RETURN(std::span<const uint8_t> payload, reader_.open_unverified(frame, h));
  if (h.codec != FrameCodec::kNone) return decode(frame, layouts);
  if (checksum64(payload.data(), payload.size()) != h.payload_checksum) {
    return corruption("frame: payload checksum mismatch");
  }
  return decode_block_document_adopting(std::move(buffer), kFrameHeaderSize, payload.size(), layouts);
}

}  // namespace kvtier
