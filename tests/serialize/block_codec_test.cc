#include "serialize/format/block_codec.h"

#include <cstring>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/test_blocks.h"

namespace kvtier {
namespace {

using nlohmann::json;
using testing::Values;

struct Fixture {
  LayoutRegistry registry;
  std::shared_ptr<const KvLayout> add(const KvLayout& l) { return *registry.add(l); }
};

std::vector<KvLayout> all_layouts() {
  std::vector<KvLayout> out;
  for (const auto& name : layout_preset_names()) out.push_back(*layout_preset(name));
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16}) {
    out.push_back(KvLayout::uniform(std::string("tiny-") + std::string(dtype_name(d)), 2, 2, 64, 16, d));
  }
  KvLayout mixed = KvLayout::uniform("mixed", 3, 2, 64, 32, DType::kF16);
  mixed.layers[1].dtype = DType::kBF16;
  mixed.layers[2].dtype = DType::kF32;
  out.push_back(mixed);
  return out;
}

TEST(BlockCodecTest, EveryLayoutAndCodecRoundTripsBitExactIncludingSpecialValues) {
  Fixture f;
  for (const KvLayout& l : all_layouts()) {
    auto layout = f.add(l);
    for (FrameCodec codec : {FrameCodec::kNone, FrameCodec::kLz4, FrameCodec::kLz4Shuffle}) {
      for (Values v : {Values::kRandom, Values::kWithSpecials, Values::kKvLike}) {
        Block block = testing::make_block(layout, 17, v);
        block.mutable_identity().extra_keys = {"lora:7", "tenant-α"};
        BlockCodec codec_obj(codec);
        Bytes frame;
        ASSERT_TRUE(codec_obj.encode(block, frame).ok());
        auto back = codec_obj.decode(frame, f.registry);
        ASSERT_TRUE(back.ok()) << l.name << " " << frame_codec_name(codec) << ": "
                               << back.status().to_string();
        EXPECT_TRUE(testing::same_bytes(block, *back)) << l.name << " " << frame_codec_name(codec);
        EXPECT_EQ(back->identity(), block.identity());
        EXPECT_EQ(back->layout(), block.layout());
      }
    }
  }
}

TEST(BlockCodecTest, SpecialBitPatternsSurviveInEveryDtype) {
  Fixture f;
  for (DType d : {DType::kF16, DType::kBF16, DType::kF32}) {
    auto layout = f.add(KvLayout::uniform("s", 1, 1, 8, 16, d));
    Block block = Block::dense(layout, testing::identity_for(*layout, 1));
    auto bytes = block.dense_part(0, KvPart::kK);
    // NaN with payload, -NaN, +inf, -inf, +0, -0, smallest subnormal, largest subnormal.
    const uint16_t p16f[] = {0x7e01, 0xfd55, 0x7c00, 0xfc00, 0x0000, 0x8000, 0x0001, 0x03ff};
    const uint16_t p16b[] = {0x7fc1, 0xff81, 0x7f80, 0xff80, 0x0000, 0x8000, 0x0001, 0x007f};
    const uint32_t p32[] = {0x7fc00123, 0xff800001, 0x7f800000, 0xff800000,
                            0x00000000, 0x80000000, 0x00000001, 0x007fffff};
    for (int i = 0; i < 8; ++i) {
      if (d == DType::kF32) std::memcpy(bytes.data() + 4 * i, &p32[i], 4);
      else std::memcpy(bytes.data() + 2 * i, d == DType::kF16 ? &p16f[i] : &p16b[i], 2);
    }
    BlockCodec codec;
    Bytes frame;
    ASSERT_TRUE(codec.encode(block, frame).ok());
    auto back = codec.decode(frame, f.registry);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(std::memcmp(back->dense_part(0, KvPart::kK).data(), bytes.data(), bytes.size()), 0)
        << dtype_name(d);
  }
}

TEST(BlockCodecTest, QuantizedBlockIsStoredAsItsCpuDequantizationBitForBit) {
  Fixture f;
  auto layout = f.add(KvLayout::uniform("q", 2, 2, 64, 16, DType::kBF16));
  Block dense = testing::make_block(layout, 23, Values::kKvLike);
  Block quant = std::move(dense.quantized(Quantization{4, 32})).value();
  BlockCodec codec(FrameCodec::kLz4Shuffle);
  Bytes frame;
  ASSERT_TRUE(codec.encode(quant, frame).ok());
  auto back = codec.decode(frame, f.registry);
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(testing::same_bytes(*back, quant.dequantized()));
  for (int l = 0; l < 2; ++l) {
    ASSERT_TRUE(back->dequantized_from(l).has_value());
    EXPECT_EQ(*back->dequantized_from(l), (Quantization{4, 32}));
  }
}

// An independent reader: parse the header with nlohmann-json and check it is a well-formed
// safetensors document (string metadata, exact tiling of the data section, dtype/shape/size).
TEST(BlockDocumentTest, IsAValidSafetensorsFileToAnIndependentReader) {
  Fixture f;
  auto layout = f.add(*layout_preset("qwen3-0.6b"));
  Block block = testing::make_block(layout, 5);
  Bytes doc;
  ASSERT_TRUE(BlockCodec::encode_document(block, doc).ok());

  uint64_t n;
  std::memcpy(&n, doc.data(), 8);
  ASSERT_EQ(n % 8, 0u) << "header padded so data starts 8-aligned";
  std::string header(reinterpret_cast<const char*>(doc.data() + 8), n);
  json j = json::parse(header);
  const size_t data_len = doc.size() - 8 - n;
  ASSERT_TRUE(j["__metadata__"].is_object());
  for (auto& [k, v] : j["__metadata__"].items()) EXPECT_TRUE(v.is_string()) << k;
  EXPECT_EQ(j["__metadata__"]["hash"], block.hash().hex());
  EXPECT_EQ(j["__metadata__"]["layout_fingerprint"], layout->fingerprint_hex());
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (auto& [name, t] : j.items()) {
    if (name == "__metadata__") continue;
    EXPECT_EQ(t["dtype"], "BF16") << name;
    EXPECT_EQ(t["shape"], json({16, 8, 128})) << name;
    uint64_t b = t["data_offsets"][0], e = t["data_offsets"][1];
    EXPECT_EQ(e - b, 16u * 8 * 128 * 2) << name;
    spans.emplace_back(b, e);
  }
  EXPECT_EQ(spans.size(), 2u * 28);
  std::sort(spans.begin(), spans.end());
  uint64_t cursor = 0;
  for (auto [b, e] : spans) {
    EXPECT_EQ(b, cursor);
    cursor = e;
  }
  EXPECT_EQ(cursor, data_len);
  // And the bytes of layers.27.v are that tensor's bytes.
  uint64_t b = j["layers.27.v"]["data_offsets"][0];
  auto v27 = block.dense_part(27, KvPart::kV);
  EXPECT_EQ(std::memcmp(doc.data() + 8 + n + b, v27.data(), v27.size()), 0);
}

// --- Every decoder check, fed its bad case -------------------------------------------------------

class BlockDocumentRejectsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    layout_ = f_.add(KvLayout::uniform("tiny", 2, 2, 64, 16, DType::kBF16));
    block_ = std::make_unique<Block>(testing::make_block(layout_, 99));
    ASSERT_TRUE(BlockCodec::encode_document(*block_, doc_).ok());
    std::memcpy(&n_, doc_.data(), 8);
    header_ = json::parse(std::string(reinterpret_cast<const char*>(doc_.data() + 8), n_));
  }
  // Rebuilds the document around an edited header, keeping the data section.
  std::vector<uint8_t> with_header(const std::string& text) {
    const uint64_t n = text.size();
    const size_t data_len = doc_.size() - 8 - n_;
    std::vector<uint8_t> out(8 + n + data_len);
    std::memcpy(out.data(), &n, 8);
    std::memcpy(out.data() + 8, text.data(), n);
    std::memcpy(out.data() + 8 + n, doc_.data() + 8 + n_, data_len);
    return out;
  }
  std::vector<uint8_t> with_header(const json& j) { return with_header(j.dump()); }
  void expect_rejected(std::span<const uint8_t> doc, const std::string& part,
                       StatusCode code = StatusCode::kCorruption) {
    auto r = decode_block_document(doc, f_.registry);
    ASSERT_FALSE(r.ok()) << "accepted; expected: " << part;
    EXPECT_EQ(r.status().code(), code) << r.status().to_string();
    EXPECT_NE(r.status().message().find(part), std::string::npos) << r.status().message();
  }

  Fixture f_;
  std::shared_ptr<const KvLayout> layout_;
  std::unique_ptr<Block> block_;
  Bytes doc_;
  uint64_t n_ = 0;
  json header_;
};

// Metadata this writer emits plainly is split without a JSON parser; anything else (escapes,
// non-ASCII, a key given twice) must come out exactly as a JSON reader sees it.
TEST_F(BlockDocumentRejectsTest, MetadataIsReadAsAJsonReaderReadsIt) {
  Block b = block_->clone();
  b.mutable_identity().namespace_id = "team \"a\"\\lab/\u00e9\n";
  b.mutable_identity().extra_keys = {"lora:x\"y", "\u00fc", ""};
  Bytes doc;
  ASSERT_TRUE(BlockCodec::encode_document(b, doc).ok());
  auto got = decode_block_document(doc, f_.registry);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(got->identity().namespace_id, b.identity().namespace_id);
  EXPECT_EQ(got->identity().extra_keys, b.identity().extra_keys);
  EXPECT_TRUE(testing::same_bytes(*got, b));

  // "namespace" twice: the plain split refuses it and the JSON parse decides, as any reader would.
  std::string text = header_.dump();
  const std::string ns = "\"namespace\":";
  const size_t at = text.find(ns);
  ASSERT_NE(at, std::string::npos);
  text.insert(at, ns + "\"first\",");
  const json reread = json::parse(text);
  auto dup = decode_block_document(with_header(text), f_.registry);
  ASSERT_TRUE(dup.ok()) << dup.status().to_string();
  EXPECT_EQ(dup->identity().namespace_id, reread["__metadata__"]["namespace"].get<std::string>());

  // A value that is not a string is refused on either path.
  std::string number = header_.dump();
  const std::string fmt = "\"format\":\"";
  const size_t f = number.find(fmt);
  ASSERT_NE(f, std::string::npos);
  const size_t close = number.find('"', f + fmt.size());
  number.replace(f + fmt.size() - 1, close - (f + fmt.size() - 1) + 1, "7");
  expect_rejected(with_header(number), "__metadata__.format is not a string");
}

TEST_F(BlockDocumentRejectsTest, TruncatedDocuments) {
  const std::span<const uint8_t> doc(doc_);
  expect_rejected(doc.first(5), "truncated");
  expect_rejected(doc.first(8 + n_ / 2), "does not fit");
  expect_rejected(doc.first(doc.size() - 1), "outside");
}

TEST_F(BlockDocumentRejectsTest, HugeHeaderLength) {
  auto doc = doc_;
  uint64_t huge = ~0ull - 3;
  std::memcpy(doc.data(), &huge, 8);
  expect_rejected(doc, "header length");
}

TEST_F(BlockDocumentRejectsTest, NonJsonHeader) {
  expect_rejected(with_header(std::string("{\"__metadata__\": [unterminated")), "not valid JSON");
  expect_rejected(with_header(std::string("[1,2,3]")), "not a JSON object");
}

TEST_F(BlockDocumentRejectsTest, WrongDtype) {
  header_["layers.1.k"]["dtype"] = "F16";
  expect_rejected(with_header(header_), "has dtype F16, the layout says BF16");
}

TEST_F(BlockDocumentRejectsTest, WrongShape) {
  header_["layers.0.v"]["shape"] = json({16, 2, 32});
  expect_rejected(with_header(header_), "has shape");
}

TEST_F(BlockDocumentRejectsTest, OverlappingOffsets) {
  // Shift layers.0.v back by 2 bytes and grow nothing: it overlaps layers.0.k.
  auto& offs = header_["layers.0.v"]["data_offsets"];
  offs = json({offs[0].get<uint64_t>() - 2, offs[1].get<uint64_t>() - 2});
  expect_rejected(with_header(header_), "overlaps");
}

TEST_F(BlockDocumentRejectsTest, OffsetsPastTheData) {
  header_["layers.1.v"]["data_offsets"] = json({1ull << 40, (1ull << 40) + 4096});
  expect_rejected(with_header(header_), "fall outside");
}

TEST_F(BlockDocumentRejectsTest, NegativeOrNonIntegerOffsets) {
  header_["layers.0.k"]["data_offsets"] = json({-1, 4095});
  expect_rejected(with_header(header_), "non-negative integers");
}

TEST_F(BlockDocumentRejectsTest, MissingAndUnknownTensors) {
  auto a = header_;
  a.erase("layers.1.v");
  expect_rejected(with_header(a), "holds 3 tensors");
  auto b = header_;
  b["layers.9.k"] = b["layers.1.v"];
  b.erase("layers.1.v");
  expect_rejected(with_header(b), "missing tensor layers.1.v");
}

TEST_F(BlockDocumentRejectsTest, WrongLayout) {
  auto h = header_;
  h["__metadata__"]["layout_fingerprint"] = "0123456789abcdef";
  expect_rejected(with_header(h), "unknown layout fingerprint", StatusCode::kInvalidArgument);
  h["__metadata__"]["layout_fingerprint"] = "xyz";
  expect_rejected(with_header(h), "16 hex digits");
  // A registered layout that differs from the one the tensors were written for.
  auto other = f_.add(KvLayout::uniform("other", 2, 2, 64, 16, DType::kF16));
  h["__metadata__"]["layout_fingerprint"] = other->fingerprint_hex();
  expect_rejected(with_header(h), "has dtype BF16, the layout says F16");
}

TEST_F(BlockDocumentRejectsTest, MetadataTypesAndFields) {
  auto a = header_;
  a["__metadata__"]["token_ids"] = json({1, 2, 3});
  expect_rejected(with_header(a), "token_ids is not a string");
  auto b = header_;
  b["__metadata__"]["token_ids"] = "1,2,x";
  expect_rejected(with_header(b), "comma-separated");
  auto c = header_;
  c["__metadata__"]["token_ids"] = "1,2,3";
  expect_rejected(with_header(c), "holds 3 tokens");
  auto d = header_;
  d["__metadata__"]["hash"] = "abc";
  expect_rejected(with_header(d), "hash");
  auto e = header_;
  e["__metadata__"]["mood"] = "happy";
  expect_rejected(with_header(e), "unknown __metadata__ field 'mood'");
  auto g = header_;
  g["__metadata__"].erase("parent_hash");
  expect_rejected(with_header(g), "missing __metadata__.parent_hash");
  auto h = header_;
  h["__metadata__"]["dequantized_from"] = R"({"7":{"bits":4,"group_size":64}})";
  expect_rejected(with_header(h), "outside the layout");
  auto i = header_;
  i["__metadata__"]["format"] = "kvtier.block.v0";
  expect_rejected(with_header(i), "is not kvtier.block.v1");
}

TEST_F(BlockDocumentRejectsTest, TrailingBytesNoTensorCovers) {
  auto doc = doc_;
  doc.push_back(0);
  expect_rejected(doc, "trailing bytes");
}

// --- Frames ---------------------------------------------------------------------------------------

class FrameRejectsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    layout_ = f_.add(KvLayout::uniform("tiny", 2, 2, 64, 16, DType::kBF16));
    Block b = testing::make_block(layout_, 4, Values::kKvLike);
    ASSERT_TRUE(BlockCodec(FrameCodec::kLz4Shuffle).encode(b, frame_).ok());
  }
  void expect_rejected(std::span<const uint8_t> frame, const std::string& part) {
    BlockCodec codec;
    auto r = codec.decode(frame, f_.registry);
    ASSERT_FALSE(r.ok()) << "accepted; expected: " << part;
    EXPECT_EQ(r.status().code(), StatusCode::kCorruption);
    EXPECT_NE(r.status().message().find(part), std::string::npos) << r.status().message();
  }
  Fixture f_;
  std::shared_ptr<const KvLayout> layout_;
  Bytes frame_;
};

TEST_F(FrameRejectsTest, EveryFlippedByteIsDetected) {
  // Flip one bit at a spread of positions across header and payload.
  for (size_t pos = 0; pos < frame_.size(); pos += std::max<size_t>(1, frame_.size() / 97)) {
    auto bad = frame_;
    bad[pos] ^= 0x10;
    BlockCodec codec;
    EXPECT_FALSE(codec.decode(bad, f_.registry).ok()) << "flip at " << pos;
  }
  auto bad = frame_;
  bad.back() ^= 1;
  expect_rejected(bad, "payload checksum mismatch");
  bad = frame_;
  bad[9] ^= 1;  // raw length
  expect_rejected(bad, "header checksum mismatch");
  bad = frame_;
  bad[0] = 'X';
  expect_rejected(bad, "bad magic");
}

TEST_F(FrameRejectsTest, TruncatedFrames) {
  const std::span<const uint8_t> frame(frame_);
  expect_rejected(frame.first(20), "truncated header");
  expect_rejected(frame.first(frame.size() - 1), "truncated payload");
}

TEST(FrameTest, IncompressibleDocumentsAreStoredRawAndSaySo) {
  std::vector<uint8_t> doc(4096);
  std::mt19937 rng(1);
  for (auto& b : doc) b = static_cast<uint8_t>(rng());
  FrameWriter w;
  std::vector<uint8_t> dst(max_frame_size(doc.size(), FrameCodec::kLz4));
  auto h = w.write(doc, FrameCodec::kLz4, 0, dst);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->codec, FrameCodec::kNone);
  EXPECT_EQ(h->stored_length, doc.size());
  FrameReader r;
  auto back = r.open(std::span<const uint8_t>(dst.data(), h->frame_size()));
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(std::equal(back->begin(), back->end(), doc.begin(), doc.end()));
}

TEST(FrameTest, ShuffledLz4ShrinksKvLikeBf16MoreThanPlainLz4) {
  LayoutRegistry reg;
  auto layout = *reg.add(*layout_preset("llama-3-8b"));
  Block b = testing::make_block(layout, 8, Values::kKvLike);
  Bytes plain, shuffled;
  ASSERT_TRUE(BlockCodec(FrameCodec::kLz4).encode(b, plain).ok());
  ASSERT_TRUE(BlockCodec(FrameCodec::kLz4Shuffle).encode(b, shuffled).ok());
  EXPECT_LT(shuffled.size(), plain.size());
}

}  // namespace
}  // namespace kvtier

namespace kvtier {
namespace {

TEST(BlockCodecOwnedTest, AdoptsAVerifiedFrameAndStillRejectsADamagedOne) {
  LayoutRegistry reg;
  auto layout = *reg.add(*layout_preset("tiny"));
  Block b = testing::make_block(layout, 3, testing::Values::kWithSpecials);
  Bytes frame;
  ASSERT_TRUE(BlockCodec().encode(b, frame).ok());
  auto owned_copy = [&](const Bytes& f) {
    AlignedBuffer buf(f.size() + 100, 4096, false);
    std::memcpy(buf.data(), f.data(), f.size());
    return buf;
  };
  BlockCodec codec;
  auto got = codec.decode_owned(owned_copy(frame), frame.size(), reg);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(testing::same_bytes(*got, b));
  EXPECT_EQ(got->identity(), b.identity());
  EXPECT_GE(got->size_bytes(), frame.size()) << "it kept the frame's storage";

  Bytes bad = frame;
  bad[bad.size() / 2] ^= 4;
  auto rejected = codec.decode_owned(owned_copy(bad), bad.size(), reg);
  ASSERT_FALSE(rejected.ok());
  EXPECT_EQ(rejected.status().code(), StatusCode::kCorruption);

  // Compressed frames take the copying path and give the same block.
  Bytes lz;
  ASSERT_TRUE(BlockCodec(FrameCodec::kLz4Shuffle).encode(b, lz).ok());
  auto from_lz = codec.decode_owned(owned_copy(lz), lz.size(), reg);
  ASSERT_TRUE(from_lz.ok());
  EXPECT_TRUE(testing::same_bytes(*from_lz, b));
}

}  // namespace
}  // namespace kvtier
