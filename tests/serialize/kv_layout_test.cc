#include "serialize/kv_layout.h"

#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/temp_dir.h"

namespace kvtier {
namespace {

TEST(KvLayoutTest, PresetsAreValidAndSizedFromTheirDtype) {
  for (const std::string& name : layout_preset_names()) {
    auto l = layout_preset(name);
    ASSERT_TRUE(l.ok()) << name;
    EXPECT_TRUE(l->validate().ok()) << name;
  }
  auto llama = layout_preset("llama-3-8b");
  ASSERT_TRUE(llama.ok());
  // 32 layers x (K+V) x 16 tokens x 8 heads x 128 dims x 2 bytes (bf16) = 2 MiB.
  EXPECT_EQ(llama->dense_block_bytes(), 2u * 1024 * 1024);
  KvLayout f32 = KvLayout::uniform("x", 32, 8, 128, 16, DType::kF32);
  EXPECT_EQ(f32.dense_block_bytes(), 4u * 1024 * 1024) << "sizes come from the dtype, not fp16";
  EXPECT_FALSE(layout_preset("gpt-5").ok());
}

TEST(KvLayoutTest, JsonRoundTripKeepsEveryField) {
  KvLayout l = KvLayout::uniform("mixed", 3, 4, 64, 32, DType::kF16);
  l.layers[1].dtype = DType::kBF16;
  l.layers[2].quantization = Quantization{4, 32};
  auto back = KvLayout::from_json(l.to_json());
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(*back, l);
  EXPECT_EQ(back->fingerprint(), l.fingerprint());
}

TEST(KvLayoutTest, LoadsFromFileWithLayoutWideDtype) {
  testing::TempDir dir;
  std::ofstream(dir / "l.json") << R"({"name":"q","num_layers":2,"num_kv_heads":2,"head_dim":64,"dtype":"BF16"})";
  auto l = KvLayout::load_file((dir / "l.json").string());
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  EXPECT_EQ(l->block_size, 16) << "block_size defaults to 16";
  EXPECT_EQ(l->layers[1].dtype, DType::kBF16);
  EXPECT_EQ(KvLayout::load_file((dir / "missing.json").string()).status().code(),
            StatusCode::kNotFound);
}

struct BadLayoutCase {
  const char* json;
  const char* message_part;
};

class KvLayoutRejectsTest : public ::testing::TestWithParam<BadLayoutCase> {};

TEST_P(KvLayoutRejectsTest, WithAClearMessage) {
  auto r = KvLayout::from_json_text(GetParam().json);
  ASSERT_FALSE(r.ok()) << GetParam().json;
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find(GetParam().message_part), std::string::npos)
      << r.status().message();
}

INSTANTIATE_TEST_SUITE_P(
    BadInputs, KvLayoutRejectsTest,
    ::testing::Values(
        BadLayoutCase{"not json", "not valid JSON"},
        BadLayoutCase{R"({"num_kv_heads":2,"head_dim":64,"dtype":"F16"})", "missing field 'num_layers'"},
        BadLayoutCase{R"({"num_layers":"2","num_kv_heads":2,"head_dim":64,"dtype":"F16"})", "must be an integer"},
        BadLayoutCase{R"({"num_layers":2,"num_kv_heads":2,"head_dim":64,"dtype":"F16","colour":1})", "unknown field 'colour'"},
        BadLayoutCase{R"({"num_layers":2,"num_kv_heads":2,"head_dim":64,"dtype":"FP8"})", "unknown dtype"},
        BadLayoutCase{R"({"num_layers":2,"num_kv_heads":2,"head_dim":64,"dtype":"U32"})", "is not F32, F16 or BF16"},
        BadLayoutCase{R"({"num_layers":2,"num_kv_heads":2,"head_dim":60,"dtype":"F16"})", "multiple of 8"},
        BadLayoutCase{R"({"num_layers":0,"num_kv_heads":2,"head_dim":64,"dtype":"F16"})", "num_layers"},
        BadLayoutCase{R"({"num_layers":2,"num_kv_heads":2,"head_dim":64})", "missing field 'dtype'"},
        BadLayoutCase{R"({"num_layers":2,"num_kv_heads":2,"head_dim":64,"layers":[{"dtype":"F16"}]})", "1 entries for num_layers 2"},
        BadLayoutCase{R"({"num_layers":1,"num_kv_heads":2,"head_dim":64,"dtype":"F16","layers":[{"quantization":{"bits":3,"group_size":64}}]})", "bits must be 4 or 8"},
        BadLayoutCase{R"({"num_layers":1,"num_kv_heads":2,"head_dim":64,"dtype":"F16","layers":[{"quantization":{"bits":4,"group_size":128}}]})", "not a multiple of quantization group_size"},
        BadLayoutCase{R"({"num_layers":1,"num_kv_heads":2,"head_dim":64,"dtype":"F16","layers":[{"quantization":{"bits":4}}]})", "missing field 'group_size'"}),
    [](const ::testing::TestParamInfo<BadLayoutCase>& info) {
      std::string name;
      for (char c : std::string(info.param.message_part)) {
        if (std::isalnum(static_cast<unsigned char>(c))) name += c;
      }
      return name;
    });

TEST(KvLayoutTest, FingerprintIsStableAndIgnoresOnlyTheName) {
  KvLayout a = KvLayout::uniform("a", 32, 8, 128, 16, DType::kBF16);
  KvLayout b = a;
  b.name = "renamed";
  EXPECT_EQ(a.fingerprint(), b.fingerprint());
  // Frozen value: if this changes, every stored block's layout fingerprint changes with it.
  EXPECT_EQ(a.fingerprint_hex(), "2e520454ab353108");

  auto differs = [&](auto mutate) {
    KvLayout c = a;
    mutate(c);
    return c.fingerprint() != a.fingerprint();
  };
  EXPECT_TRUE(differs([](KvLayout& c) { c.block_size = 32; }));
  EXPECT_TRUE(differs([](KvLayout& c) { c.head_dim = 64; }));
  EXPECT_TRUE(differs([](KvLayout& c) { c.num_kv_heads = 4; }));
  EXPECT_TRUE(differs([](KvLayout& c) { c.layers[5].dtype = DType::kF16; }));
  EXPECT_TRUE(differs([](KvLayout& c) { c.layers[0].quantization = Quantization{8, 64}; }));
  EXPECT_TRUE(differs([](KvLayout& c) {
    c.num_layers = 31;
    c.layers.pop_back();
  }));
}

}  // namespace
}  // namespace kvtier
