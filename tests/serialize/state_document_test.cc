// The state document: a hybrid model's GDN snapshot round-trips bit for bit, and every kind of
// damage is a corruption with its reason, never a snapshot.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include <nlohmann/json.hpp>

#include "serialize/format/state_document.h"

namespace kvtier {
namespace {

HybridLayout layout(int d_v = 16) {
  nlohmann::json j = {{"name", "small-hybrid"}, {"block_size", 16}, {"dtype", "BF16"},
                      {"attention", {{"num_kv_heads", 1}, {"head_dim", 64}}},
                      {"gdn", {{"heads", 2}, {"d_k", 8}, {"d_v", d_v}, {"conv_width", 4}, {"conv_channels", 12}}},
                      {"pattern", {"gdn", "attention", "gdn"}}};
  return std::move(HybridLayout::from_json(j)).value();
}

StateSnapshot snapshot(const HybridLayout& l, uint32_t seed) {
  StateSnapshot s;
  s.at = BlockHash{};
  for (size_t i = 0; i < s.at.bytes.size(); ++i) s.at.bytes[i] = static_cast<uint8_t>(seed * 31 + i);
  s.tokens = 48;
  s.ns = "model-a";
  s.data = AlignedBuffer(l.snapshot_bytes());
  // Every bit pattern, NaN payloads and infinities included: stored words, not values.
  std::mt19937 rng(seed);
  for (size_t i = 0; i < s.data.size(); i += 4) {
    const uint32_t w = rng();
    std::memcpy(s.data.data() + i, &w, 4);
  }
  return s;
}

std::string reason(const Result<StateSnapshot>& r) { return r.ok() ? "decoded" : r.status().message(); }

TEST(StateDocumentTest, RoundTripsEveryBitAndItsMetadata) {
  const HybridLayout l = layout();
  const StateSnapshot s = snapshot(l, 1);
  Bytes doc;
  ASSERT_TRUE(encode_state_document(l, s, doc).ok());
  auto back = decode_state_document(doc, l);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->at, s.at);
  EXPECT_EQ(back->tokens, 48u);
  EXPECT_EQ(back->ns, "model-a");
  ASSERT_EQ(back->data.size(), s.data.size());
  EXPECT_EQ(std::memcmp(back->data.data(), s.data.data(), s.data.size()), 0);
  // A safetensors header: GDN layers 0 and 2 (their places in the pattern), state then window.
  uint64_t n = 0;
  std::memcpy(&n, doc.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  const auto header = nlohmann::json::parse(doc.begin() + 8, doc.begin() + 8 + n);
  EXPECT_EQ(header["layers.0.state"]["shape"], nlohmann::json({2, 8, 16}));
  EXPECT_EQ(header["layers.2.conv_window"]["shape"], nlohmann::json({12, 3}));
  EXPECT_EQ(header["layers.2.conv_window"]["data_offsets"][1], l.snapshot_bytes());
  EXPECT_FALSE(header.contains("layers.1.state"));
}

TEST(StateDocumentTest, DamageIsACorruptionWithItsReason) {
  const HybridLayout l = layout();
  Bytes doc;
  ASSERT_TRUE(encode_state_document(l, snapshot(l, 2), doc).ok());
  uint64_t n = 0;
  std::memcpy(&n, doc.data(), 8);
  auto header_text = [&] { return std::string(doc.begin() + 8, doc.begin() + 8 + n); };
  auto with_header = [&](std::string text) {
    text.resize(n, ' ');  // same length: only the header's content changes
    Bytes d = doc;
    std::memcpy(d.data() + 8, text.data(), n);
    return d;
  };
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string t = header_text();
    const size_t at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    t.replace(at, from.size(), to);
    return with_header(t);
  };
  const std::pair<Bytes, const char*> cases[] = {
      {Bytes(doc.begin(), doc.begin() + 5), "truncated"},
      {Bytes(doc.begin(), doc.end() - 4), "data of"},
      {replaced("\"F32\"", "\"F16\""), "expected F32"},
      {replaced("kvtier.state.v1", "kvtier.state.v0"), "format"},
      {replaced("\"tokens\":\"48\"", "\"tokens\":\"4x\""), "decimal"},
      {replaced("{", "["), "not a JSON object"},
  };
  for (const auto& [bytes, why] : cases) {
    auto r = decode_state_document(bytes, l);
    ASSERT_FALSE(r.ok()) << why;
    EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << r.status().to_string();
    EXPECT_NE(reason(r).find(why), std::string::npos) << reason(r);
  }
  // A snapshot of another hybrid shape is not this one's, even with the same bytes.
  auto other = decode_state_document(doc, layout(/*d_v=*/8));
  EXPECT_EQ(other.status().code(), StatusCode::kCorruption);
  EXPECT_NE(reason(other).find("layout fingerprint"), std::string::npos) << reason(other);
}

TEST(StateDocumentTest, ASnapshotOfTheWrongSizeIsRefusedBeforeAnythingIsWritten) {
  const HybridLayout l = layout();
  StateSnapshot s = snapshot(l, 3);
  s.data = AlignedBuffer(l.snapshot_bytes() - 4);
  Bytes doc = {1, 2, 3};
  EXPECT_EQ(encode_state_document(l, s, doc).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(doc.size(), 3u);
}

}  // namespace
}  // namespace kvtier
