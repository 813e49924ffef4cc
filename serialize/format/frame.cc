#include "serialize/format/frame.h"

#include <cstring>
#include <string>

#include <lz4.h>

#include "serialize/format/byte_shuffle.h"
#include "serialize/format/checksum.h"

namespace kvtier {

namespace {

void put_u16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }
void put_u32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }
void put_u64(uint8_t* p, uint64_t v) { std::memcpy(p, &v, 8); }
uint16_t get_u16(const uint8_t* p) { uint16_t v; std::memcpy(&v, p, 2); return v; }
uint32_t get_u32(const uint8_t* p) { uint32_t v; std::memcpy(&v, p, 4); return v; }
uint64_t get_u64(const uint8_t* p) { uint64_t v; std::memcpy(&v, p, 8); return v; }

Status bad_frame(const std::string& why) { return corruption("frame: " + why); }

}  // namespace

std::string_view frame_codec_name(FrameCodec c) {
  switch (c) {
    case FrameCodec::kNone: return "none";
    case FrameCodec::kLz4: return "lz4";
    case FrameCodec::kLz4Shuffle: return "lz4-shuffle";
  }
  return "?";
}

Result<FrameCodec> parse_frame_codec(std::string_view name) {
  for (FrameCodec c : {FrameCodec::kNone, FrameCodec::kLz4, FrameCodec::kLz4Shuffle}) {
    if (frame_codec_name(c) == name) return c;
  }
  return invalid_argument("unknown compression '" + std::string(name) +
                          "' (expected none, lz4 or lz4-shuffle)");
}

size_t max_frame_size(size_t raw_length, FrameCodec codec) {
  size_t payload = raw_length;
  if (codec != FrameCodec::kNone && raw_length <= kMaxFrameRawLength) {
    payload = std::max(payload, static_cast<size_t>(LZ4_compressBound(static_cast<int>(raw_length))));
  }
  return kFrameHeaderSize + payload;
}

Result<FrameHeader> FrameWriter::write(std::span<const uint8_t> document, FrameCodec codec,
                                       uint8_t shuffle_width, std::span<uint8_t> dst) {
  if (document.size() > kMaxFrameRawLength) {
    return invalid_argument("frame: document of " + std::to_string(document.size()) +
                            " bytes exceeds the 1 GiB frame limit");
  }
  if (dst.size() < max_frame_size(document.size(), codec)) {
    return invalid_argument("frame: destination smaller than max_frame_size");
  }
  if (codec == FrameCodec::kLz4Shuffle && shuffle_width != 2 && shuffle_width != 4) {
    return invalid_argument("frame: shuffle width must be 2 or 4");
  }
  FrameHeader h;
  h.raw_length = document.size();
  uint8_t* payload = dst.data() + kFrameHeaderSize;
  if (codec != FrameCodec::kNone) {
    std::span<const uint8_t> src = document;
    if (codec == FrameCodec::kLz4Shuffle) {
      shuffled_.resize(document.size());
      byte_shuffle(document, shuffled_, shuffle_width);
      src = shuffled_;
    }
    const int capacity = static_cast<int>(dst.size() - kFrameHeaderSize);
    const int n = LZ4_compress_default(reinterpret_cast<const char*>(src.data()),
                                       reinterpret_cast<char*>(payload),
                                       static_cast<int>(src.size()), capacity);
    if (n > 0 && static_cast<size_t>(n) < document.size()) {
      h.codec = codec;
      h.shuffle_width = codec == FrameCodec::kLz4Shuffle ? shuffle_width : 0;
      h.stored_length = static_cast<uint64_t>(n);
    }
  }
  if (h.codec == FrameCodec::kNone) {
    std::memcpy(payload, document.data(), document.size());
    h.stored_length = document.size();
  }
  h.payload_checksum = checksum64(payload, h.stored_length);
  write_frame_header(h, dst.data());
  return h;
}

void write_frame_header(const FrameHeader& h, uint8_t* p) {
  put_u32(p, kFrameMagic);
  put_u16(p + 4, kFrameVersion);
  p[6] = static_cast<uint8_t>(h.codec);
  p[7] = h.shuffle_width;
  put_u64(p + 8, h.raw_length);
  put_u64(p + 16, h.stored_length);
  put_u64(p + 24, h.payload_checksum);
  put_u64(p + 32, 0);
  put_u64(p + 40, checksum64(p, 40));
}

FrameHeader frame_in_place(std::span<uint8_t> buffer, size_t document_size) {
  FrameHeader h;
  h.raw_length = h.stored_length = document_size;
  h.payload_checksum = checksum64(buffer.data() + kFrameHeaderSize, document_size);
  write_frame_header(h, buffer.data());
  return h;
}

Result<FrameHeader> parse_frame_header(std::span<const uint8_t> bytes) {
  if (bytes.size() < kFrameHeaderSize) {
    return bad_frame("truncated header: " + std::to_string(bytes.size()) + " bytes");
  }
  const uint8_t* p = bytes.data();
  if (get_u32(p) != kFrameMagic) return bad_frame("bad magic");
  if (get_u64(p + 40) != checksum64(p, 40)) return bad_frame("header checksum mismatch");
  const uint16_t version = get_u16(p + 4);
  if (version != kFrameVersion) {
    return bad_frame("format version " + std::to_string(version) + " is not supported (expected " +
                     std::to_string(kFrameVersion) + ")");
  }
  FrameHeader h;
  if (p[6] > 2) return bad_frame("unknown codec " + std::to_string(p[6]));
  h.codec = static_cast<FrameCodec>(p[6]);
  h.shuffle_width = p[7];
  h.raw_length = get_u64(p + 8);
  h.stored_length = get_u64(p + 16);
  h.payload_checksum = get_u64(p + 24);
  if (h.raw_length > kMaxFrameRawLength) return bad_frame("raw length exceeds 1 GiB");
  if (h.codec == FrameCodec::kNone && h.stored_length != h.raw_length) {
    return bad_frame("uncompressed frame with stored length != raw length");
  }
  if (h.codec != FrameCodec::kNone &&
      h.stored_length > static_cast<uint64_t>(LZ4_compressBound(static_cast<int>(h.raw_length)))) {
    return bad_frame("stored length exceeds the LZ4 bound of the raw length");
  }
  if (h.codec == FrameCodec::kLz4Shuffle ? (h.shuffle_width != 2 && h.shuffle_width != 4)
                                         : h.shuffle_width != 0) {
    return bad_frame("bad shuffle width " + std::to_string(h.shuffle_width));
  }
  return h;
}

Result<std::span<const uint8_t>> FrameReader::open_unverified(std::span<const uint8_t> frame,
                                                              FrameHeader& h) {
  KVTIER_ASSIGN_OR_RETURN(h, parse_frame_header(frame));
  if (frame.size() - kFrameHeaderSize < h.stored_length) {
    return bad_frame("truncated payload: header says " + std::to_string(h.stored_length) +
                     " bytes, " + std::to_string(frame.size() - kFrameHeaderSize) + " present");
  }
  return frame.subspan(kFrameHeaderSize, h.stored_length);
}

Result<std::span<const uint8_t>> FrameReader::open(std::span<const uint8_t> frame) {
  FrameHeader h;
  KVTIER_ASSIGN_OR_RETURN(std::span<const uint8_t> payload, open_unverified(frame, h));
  if (checksum64(payload.data(), payload.size()) != h.payload_checksum) {
    return bad_frame("payload checksum mismatch");
  }
  if (h.codec == FrameCodec::kNone) return payload;

  decompressed_.resize(h.raw_length);
  const int n = LZ4_decompress_safe(reinterpret_cast<const char*>(payload.data()),
                                    reinterpret_cast<char*>(decompressed_.data()),
                                    static_cast<int>(payload.size()),
                                    static_cast<int>(h.raw_length));
  if (n < 0 || static_cast<uint64_t>(n) != h.raw_length) {
    return bad_frame("LZ4 payload does not decompress to " + std::to_string(h.raw_length) + " bytes");
  }
  if (h.codec == FrameCodec::kLz4) return std::span<const uint8_t>(decompressed_);
  unshuffled_.resize(h.raw_length);
  byte_unshuffle(decompressed_, unshuffled_, h.shuffle_width);
  return std::span<const uint8_t>(unshuffled_);
}

}  // namespace kvtier
