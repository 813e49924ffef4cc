// The storage frame: a fixed header around one block document, so a reader can tell a whole,
// intact record from a torn or corrupt one before it parses anything. Layout (little-endian):
//
//   offset  size  field
//   0       4     magic "KVTF"
//   4       2     format version (1)
//   6       1     codec: 0 none, 1 lz4, 2 lz4 after byte shuffle
//   7       1     shuffle width in bytes (2 or 4 for codec 2, else 0)
//   8       8     raw length: bytes of the document
//   16      8     stored length: bytes of payload after this header
//   24      8     xxh3-64 of the stored payload
//   32      8     reserved, 0
//   40      8     xxh3-64 of header bytes [0, 40)
//   48      ...   payload (stored length bytes)
//
// A compressed frame whose payload would not be smaller than the document is written with codec 0
// instead: the header always says what is really stored.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "base/memory/bytes.h"
#include "base/status.h"

namespace kvtier {

enum class FrameCodec : uint8_t { kNone = 0, kLz4 = 1, kLz4Shuffle = 2 };
std::string_view frame_codec_name(FrameCodec c);              // "none", "lz4", "lz4-shuffle"
Result<FrameCodec> parse_frame_codec(std::string_view name);

inline constexpr uint32_t kFrameMagic = 0x4654564b;  // "KVTF"
inline constexpr uint16_t kFrameVersion = 1;
inline constexpr size_t kFrameHeaderSize = 48;
// Documents above this are refused (LZ4 works on int sizes; a block is a few MiB).
inline constexpr uint64_t kMaxFrameRawLength = 1ull << 30;

struct FrameHeader {
  FrameCodec codec = FrameCodec::kNone;
  uint8_t shuffle_width = 0;
  uint64_t raw_length = 0;
  uint64_t stored_length = 0;
  uint64_t payload_checksum = 0;
  size_t frame_size() const { return kFrameHeaderSize + stored_length; }
};

// Upper bound of a frame's size for a document of `raw_length` bytes.
size_t max_frame_size(size_t raw_length, FrameCodec codec);

// Writes the 48-byte header (magic, version, lengths, checksums) for `h` at `dst`. For writers
// that put an uncompressed payload in place themselves (BlockCodec: document and checksum in one
// pass); FrameWriter::write does this for every other case.
void write_frame_header(const FrameHeader& h, uint8_t* dst);

// Not thread-safe (holds scratch buffers); one per thread.
class FrameWriter {
 public:
  // Writes the frame of `document` into `dst` (at least max_frame_size bytes) and returns its header.
  Result<FrameHeader> write(std::span<const uint8_t> document, FrameCodec codec,
                            uint8_t shuffle_width, std::span<uint8_t> dst);

 private:
  Bytes shuffled_;
};

// Frames a document that already sits at buffer[kFrameHeaderSize .. + document_size) without
// moving it (codec 0): computes the checksum and writes the header in front.
FrameHeader frame_in_place(std::span<uint8_t> buffer, size_t document_size);

// Checks magic, version, codec, header checksum and length sanity of the first 48 bytes.
Result<FrameHeader> parse_frame_header(std::span<const uint8_t> bytes);

// Not thread-safe (holds scratch buffers); one per thread.
class FrameReader {
 public:
  // Verifies a whole frame (header, payload checksum, decompressed length) and returns the
  // document: a view into `frame` for codec 0, else into this reader's scratch, valid until the
  // next call. `frame` may be longer than the frame (padding) but not shorter.
  Result<std::span<const uint8_t>> open(std::span<const uint8_t> frame);

  // For codec 0 only: checks the header and lengths and returns the payload *without* verifying
  // its checksum, for a caller that verifies while it copies (BlockCodec::decode). `h` receives
  // the header.
  Result<std::span<const uint8_t>> open_unverified(std::span<const uint8_t> frame, FrameHeader& h);

 private:
  Bytes decompressed_;
  Bytes unshuffled_;
};

}  // namespace kvtier
