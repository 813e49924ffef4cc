// BlockCodec: Block <-> framed block document, the bytes kvtier stores and serves. Encoding
// dequantizes quantized layers first (to the layer's dtype, recorded in dequantized_from), writes
// the safetensors document, and frames it (optionally LZ4, optionally byte-shuffled). Decoding
// verifies the frame, then the document against its layout.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "serialize/block.h"
#include "serialize/format/block_document.h"
#include "serialize/format/frame.h"
#include "serialize/layout_registry.h"

namespace kvtier {

// Not thread-safe (scratch buffers); cheap to create, one per thread.
class BlockCodec {
 public:
  explicit BlockCodec(FrameCodec codec = FrameCodec::kNone) : codec_(codec) {}

  // The document alone (what `PUT /v1/blocks` carries and the spill path hands to the writer),
  // appended to `out`.
  static Status encode_document(const Block& block, Bytes& out);
  // The shuffle width that suits a block's data: its first layer's element size.
  static uint8_t shuffle_width_for(const KvLayout& layout);

  // A whole frame, replacing `out`'s contents.
  Status encode(const Block& block, Bytes& out);
  // Frame -> checked Block.
  Result<Block> decode(std::span<const uint8_t> frame, const LayoutRegistry& layouts);
  // The same for a frame that starts `buffer` and is `frame_length` bytes long, which the block
  // may keep as its storage (uncompressed frames: verified, then adopted without a copy).
  Result<Block> decode_owned(AlignedBuffer buffer, size_t frame_length, const LayoutRegistry& layouts);

  FrameWriter& frame_writer() { return writer_; }
  FrameReader& frame_reader() { return reader_; }

 private:
  FrameCodec codec_;
  FrameWriter writer_;
  FrameReader reader_;
  Bytes document_;
};

}  // namespace kvtier
