// State records: a hybrid snapshot as a Block of its snapshot layout survives the block codec bit
// for bit (every f32 pattern), names its KV block and hybrid layout, and a record of another
// hybrid shape, with stray padding bytes, or of the wrong size is refused with its reason.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include <nlohmann/json.hpp>

#include "serialize/format/block_codec.h"
#include "serialize/state_record.h"

namespace kvtier {
namespace {

HybridLayout hybrid(int d_v = 16) {
  nlohmann::json j = {{"name", "small-hybrid"}, {"block_size", 4}, {"dtype", "BF16"},
                      {"attention", {{"num_kv_heads", 1}, {"head_dim", 64}}},
                      {"gdn", {{"heads", 2}, {"d_k", 8}, {"d_v", d_v}, {"conv_width", 4}, {"conv_channels", 12}}},
                      {"pattern", {"gdn", "attention", "gdn"}}};
  return std::move(HybridLayout::from_json(j)).value();
}

BlockIdentity kv_identity() {
  BlockIdentity id;
  for (size_t i = 0; i < id.hash.bytes.size(); ++i) id.hash.bytes[i] = static_cast<uint8_t>(i + 1);
  id.parent_hash.bytes[0] = 9;
  id.token_ids = {5, 6, 7, 8};
  id.namespace_id = "model-a";
  id.extra_keys = {"lora-1"};
  return id;
}

AlignedBuffer random_snapshot(const HybridLayout& h, uint32_t seed) {
  AlignedBuffer s(h.snapshot_bytes());
  std::mt19937 rng(seed);
  for (size_t i = 0; i < s.size(); i += 4) {
    const uint32_t w = rng();  // NaN payloads, infinities, denormals: words, not values
    std::memcpy(s.data() + i, &w, 4);
  }
  return s;
}

BlockHash key_of(uint8_t b) {
  BlockHash k;
  k.bytes.fill(b);
  return k;
}

TEST(StateRecordTest, SnapshotLayoutHoldsOneGdnLayerPerLayerWithPadding) {
  const HybridLayout h = hybrid();
  const KvLayout l = snapshot_layout(h);
  EXPECT_EQ(l.num_layers, 2);
  EXPECT_EQ(l.block_size, 4);
  EXPECT_EQ(l.num_kv_heads, 1);
  // A layer's state and window: 2*8*16 + 12*3 = 292 floats, in K and V of 4 rows each: 37 -> 40.
  EXPECT_EQ(l.head_dim, 40);
  EXPECT_EQ(l.layers[0].dtype, DType::kF32);
  EXPECT_TRUE(l.validate().ok());
  EXPECT_EQ(l.name, "small-hybrid.state");
}

TEST(StateRecordTest, RoundTripsThroughTheBlockCodecBitForBit) {
  const HybridLayout h = hybrid();
  LayoutRegistry layouts;
  auto layout = layouts.add(snapshot_layout(h));
  ASSERT_TRUE(layout.ok());
  const AlignedBuffer snap = random_snapshot(h, 7);
  auto record = make_state_record(h, *layout, kv_identity(), key_of(0xab), 48, snap.span());
  ASSERT_TRUE(record.ok()) << record.status().to_string();
  EXPECT_TRUE(is_state_record(*record));
  EXPECT_EQ(record->hash(), key_of(0xab));
  EXPECT_EQ(record->identity().parent_hash, kv_identity().hash);
  EXPECT_EQ(record->identity().token_ids, kv_identity().token_ids);
  const std::vector<std::string> keys{kStateRecordTag, "hybrid=" + h.fingerprint_hex(), "tokens=48", "lora-1"};
  EXPECT_EQ(record->identity().extra_keys, keys);
  EXPECT_EQ(*prefix_tokens_of(*record), 48u);
  EXPECT_EQ(block_extra_keys_of(*record), std::vector<std::string>{"lora-1"});

  for (FrameCodec codec : {FrameCodec::kNone, FrameCodec::kLz4}) {
    BlockCodec c(codec);
    Bytes frame;
    ASSERT_TRUE(c.encode(*record, frame).ok());
    auto back = c.decode(frame, layouts);
    ASSERT_TRUE(back.ok()) << back.status().to_string();
    EXPECT_EQ(back->identity(), record->identity());
    auto out = snapshot_of(h, *back);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    ASSERT_EQ(out->size(), snap.size());
    EXPECT_EQ(std::memcmp(out->data(), snap.data(), snap.size()), 0);
  }
}

TEST(StateRecordTest, RefusesWhatNoSnapshotWrote) {
  const HybridLayout h = hybrid();
  auto layout = std::make_shared<const KvLayout>(snapshot_layout(h));
  const AlignedBuffer snap = random_snapshot(h, 3);

  auto short_one = make_state_record(h, layout, kv_identity(), key_of(1), 48, snap.span().first(snap.size() - 4));
  ASSERT_FALSE(short_one.ok());
  EXPECT_EQ(short_one.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(short_one.status().message().find("bytes"), std::string::npos);

  auto other_layout = make_state_record(h, std::make_shared<const KvLayout>(snapshot_layout(hybrid(8))),
                                        kv_identity(), key_of(1), 48, snap.span());
  EXPECT_EQ(other_layout.status().code(), StatusCode::kInvalidArgument);

  auto record = make_state_record(h, layout, kv_identity(), key_of(1), 48, snap.span());
  ASSERT_TRUE(record.ok());
  // Read as another hybrid shape's: refused by name.
  auto as_other = snapshot_of(hybrid(8), *record);
  ASSERT_FALSE(as_other.ok());
  EXPECT_EQ(as_other.status().code(), StatusCode::kCorruption);
  EXPECT_NE(as_other.status().message().find("not a state record of"), std::string::npos);

  // A byte in the padding of the last layer: not something a snapshot wrote.
  Block damaged = record->clone();
  damaged.mutable_data().back() = 1;
  auto padded = snapshot_of(h, damaged);
  ASSERT_FALSE(padded.ok());
  EXPECT_NE(padded.status().message().find("non-zero bytes past GDN layer 1"), std::string::npos);

  // A plain KV block is not a state record.
  Block plain = Block::dense(layout, kv_identity());
  EXPECT_FALSE(is_state_record(plain));
  EXPECT_FALSE(snapshot_of(h, plain).ok());
}

}  // namespace
}  // namespace kvtier
