// HybridLayout: a hybrid model's layers (attention and Gated DeltaNet), parsed, checked, and named
// by a fingerprint of its own.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "serialize/hybrid_layout.h"

namespace kvtier {
namespace {

// The Qwen3.5 pattern scaled down: three GDN layers, then attention, twice.
const char* kTinyHybrid = R"({"name": "tiny-hybrid", "block_size": 16, "dtype": "BF16",
  "attention": {"num_kv_heads": 2, "head_dim": 64},
  "gdn": {"heads": 4, "d_k": 64, "d_v": 64, "conv_width": 4, "conv_channels": 768},
  "pattern": ["gdn", "gdn", "gdn", "attention", "gdn", "gdn", "gdn", "attention"]})";

HybridLayout tiny() { return std::move(HybridLayout::from_json_text(kTinyHybrid)).value(); }

TEST(HybridLayoutTest, TheAttentionLayersFormTheKvLayoutAndTheSnapshotHoldsEveryGdnState) {
  const HybridLayout h = tiny();
  EXPECT_EQ(h.pattern().size(), 8u);
  EXPECT_EQ(h.gdn_layers(), 6);
  EXPECT_EQ(h.attention().num_layers, 2);
  EXPECT_EQ(h.attention().num_kv_heads, 2);
  EXPECT_EQ(h.attention().head_dim, 64);
  EXPECT_EQ(h.attention().block_size, 16);
  EXPECT_EQ(h.attention().dense_block_bytes(), 2u * 2 * 16 * 2 * 64 * 2);
  // 6 layers x (4 heads x 64 x 64 state + 768 channels x 3 window) x 4 bytes
  EXPECT_EQ(h.snapshot_bytes(), 6u * (4 * 64 * 64 + 768 * 3) * 4);
}

TEST(HybridLayoutTest, JsonRoundTripsAndTheFingerprintNamesTheWholeShape) {
  const HybridLayout h = tiny();
  auto again = HybridLayout::from_json(h.to_json());
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(*again, h);
  EXPECT_EQ(again->fingerprint(), h.fingerprint());
  // Not the attention layout's own: a hybrid model never shares blocks with a plain one.
  EXPECT_NE(h.fingerprint(), h.attention().fingerprint());
  // Every field of the hybrid shape changes it; the name does not.
  auto changed = [&](auto edit) {
    nlohmann::json j = h.to_json();
    edit(j);
    return std::move(HybridLayout::from_json(j)).value().fingerprint();
  };
  EXPECT_EQ(changed([](nlohmann::json& j) { j["name"] = "other"; }), h.fingerprint());
  EXPECT_NE(changed([](nlohmann::json& j) { j["gdn"]["d_v"] = 32; }), h.fingerprint());
  EXPECT_NE(changed([](nlohmann::json& j) { j["gdn"]["conv_width"] = 3; }), h.fingerprint());
  EXPECT_NE(changed([](nlohmann::json& j) { j["gdn"]["conv_channels"] = 512; }), h.fingerprint());
  EXPECT_NE(changed([](nlohmann::json& j) { j["gdn"]["heads"] = 8; }), h.fingerprint());
  EXPECT_NE(changed([](nlohmann::json& j) { j["gdn"]["d_k"] = 128; }), h.fingerprint());
  EXPECT_NE(changed([](nlohmann::json& j) {  // the same layers in another order
              j["pattern"] = {"attention", "gdn", "gdn", "gdn", "attention", "gdn", "gdn", "gdn"};
            }),
            h.fingerprint());
  EXPECT_NE(changed([](nlohmann::json& j) { j["attention"]["head_dim"] = 128; }), h.fingerprint());
  EXPECT_NE(changed([](nlohmann::json& j) { j["dtype"] = "F16"; }), h.fingerprint());
}

TEST(HybridLayoutTest, MistakesAreRefusedWithTheirReason) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"pattern": ["gdn"], "attention": {"num_kv_heads": 1, "head_dim": 64}, "dtype": "BF16",
           "gdn": {"heads": 1, "d_k": 8, "d_v": 8, "conv_channels": 8}})", "no attention layer"},
      {R"({"pattern": ["attention", "mamba"], "attention": {"num_kv_heads": 1, "head_dim": 64}, "dtype": "BF16"})",
       "pattern[1]"},
      {R"({"pattern": ["attention", "gdn"], "attention": {"num_kv_heads": 1, "head_dim": 64}, "dtype": "BF16"})",
       "no field 'gdn'"},
      {R"({"pattern": ["attention"], "attention": {"num_kv_heads": 1, "head_dim": 64}, "dtype": "BF16",
           "gdn": {"heads": 1, "d_k": 8, "d_v": 8, "conv_channels": 8}})", "no gdn layer"},
      {R"({"pattern": ["attention", "gdn"], "attention": {"num_kv_heads": 1, "head_dim": 64}, "dtype": "BF16",
           "gdn": {"heads": 1, "d_k": 8, "d_v": 8, "conv_channels": 8, "conv_width": 9}})", "conv_width"},
      {R"({"pattern": ["attention", "gdn"], "attention": {"num_kv_heads": 1, "head_dim": 64}, "dtype": "BF16",
           "gdn": {"heads": 1, "d_k": 8, "d_v": 0, "conv_channels": 8}})", "'d_v'"},
      {R"({"pattern": ["attention", "gdn"], "attention": {"num_kv_heads": 1, "head_dim": 64}, "dtype": "BF16",
           "gdn": {"heads": 1, "d_k": 8, "d_v": 8, "conv_channels": 8, "d_state": 4}})", "unknown field 'd_state'"},
      {R"({"pattern": ["attention"], "attention": {"num_kv_heads": 1, "head_dim": 60}, "dtype": "BF16"})", "head_dim"},
      {R"({"pattern": ["attention"], "attention": {"num_kv_heads": 1, "head_dim": 64}, "dtype": "BF16", "layers": []})",
       "unknown field 'layers'"},
      {R"({"pattern": [], "attention": {"num_kv_heads": 1, "head_dim": 64}, "dtype": "BF16"})", "non-empty"},
      {"not json", "not valid JSON"},
  };
  for (const auto& [text, reason] : cases) {
    auto h = HybridLayout::from_json_text(text);
    ASSERT_FALSE(h.ok()) << text;
    EXPECT_EQ(h.status().code(), StatusCode::kInvalidArgument) << text;
    EXPECT_NE(h.status().message().find(reason), std::string::npos) << h.status().message() << "\n" << text;
  }
}

}  // namespace
}  // namespace kvtier
