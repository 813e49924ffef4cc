// HybridPrefixCache on real tiers: a lookup ends at the last block with a snapshot, snapshots come
// back bit for bit from RAM and from the SSD after a restart, a snapshot never outlives its block,
// and what is refused or lost is counted.
#include "cache/hybrid_prefix_cache.h"

#include <cstring>
#include <random>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "serialize/state_record.h"
#include "tests/cache/cache_test_blocks.h"
#include "tests/tiers/ssd/ssd_test_env.h"
#include "tiers/ram_tier.h"

namespace kvtier {
namespace {

using testing::computed_block;
using testing::prompt;
using testing::small_hasher;

// The attention part is cache_test_blocks' small layout (1 layer, 1 KV head, head_dim 8, 4 tokens).
HybridLayout hybrid() {
  nlohmann::json j = {{"name", "small-hybrid"}, {"block_size", 4}, {"dtype", "BF16"},
                      {"attention", {{"num_kv_heads", 1}, {"head_dim", 8}}},
                      {"gdn", {{"heads", 2}, {"d_k", 8}, {"d_v", 8}, {"conv_width", 4}, {"conv_channels", 8}}},
                      {"pattern", {"gdn", "attention"}}};
  return std::move(HybridLayout::from_json(j)).value();
}

AlignedBuffer snapshot(uint32_t seed) {
  AlignedBuffer s(hybrid().snapshot_bytes());
  std::mt19937 rng(seed);
  for (size_t i = 0; i < s.size(); i += 4) {
    const uint32_t w = rng();
    std::memcpy(s.data() + i, &w, 4);
  }
  return s;
}

bool same(const AlignedBuffer& a, const AlignedBuffer& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0;
}

std::shared_ptr<RamTier> ram(uint64_t bytes) {
  RamTierOptions o;
  o.capacity_bytes = bytes;
  o.eviction = "chain-lru";
  return std::make_shared<RamTier>(o);
}

struct Fixture {
  explicit Fixture(std::vector<std::shared_ptr<Tier>> tiers) : cache(std::move(tiers)) {
    hybrid_cache = std::move(HybridPrefixCache::create(cache, small_hasher(), hybrid(), layouts)).value();
  }
  LayoutRegistry layouts;
  TieredCache cache;
  std::unique_ptr<HybridPrefixCache> hybrid_cache;
};

TEST(HybridPrefixCacheTest, LookupEndsAtTheLastBlockWithASnapshot) {
  Fixture f({ram(1 << 20)});
  auto h = small_hasher();
  const auto tokens = prompt(4 * 6 + 2, 1);
  const auto keys = h.keys(tokens, {});
  for (size_t i = 0; i < keys.size(); ++i) ASSERT_TRUE(f.cache.insert(computed_block(h, keys, i)).ok());

  HybridLookup none = f.hybrid_cache->lookup(keys);
  EXPECT_EQ(none.kv_blocks, 6u);
  EXPECT_EQ(none.blocks, 0u);  // KV without a snapshot restores nothing
  EXPECT_EQ(f.hybrid_cache->metrics().lookups_kv_without_snapshot.value(), 1u);

  const AlignedBuffer at1 = snapshot(1), at3 = snapshot(3);
  ASSERT_EQ(*f.hybrid_cache->store_snapshot(keys, 1, {}, at1.span()), InsertOutcome::kInserted);
  ASSERT_EQ(*f.hybrid_cache->store_snapshot(keys, 3, {}, at3.span()), InsertOutcome::kInserted);
  EXPECT_EQ(*f.hybrid_cache->store_snapshot(keys, 3, {}, at3.span()), InsertOutcome::kAlreadyPresent);
  HybridLookup r = f.hybrid_cache->lookup(keys);
  EXPECT_EQ(r.kv_blocks, 6u);
  EXPECT_EQ(r.blocks, 4u);  // blocks 0-3, ending at the snapshot after block 3
  EXPECT_EQ(r.matched_tokens, 16u);
  ASSERT_EQ(r.hits.size(), 4u);
  EXPECT_EQ(r.hits[3].hash, keys[3].hash);
  auto back = f.hybrid_cache->fetch_snapshot(keys, 3);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_TRUE(same(*back, at3));

  // A hole in the KV chain at block 2: only the prefix up to the snapshot after block 1 is left.
  ASSERT_TRUE(*f.cache.erase(keys[2].hash));
  r = f.hybrid_cache->lookup(keys);
  EXPECT_EQ(r.kv_blocks, 2u);
  EXPECT_EQ(r.blocks, 2u);
  EXPECT_TRUE(same(*f.hybrid_cache->fetch_snapshot(keys, 1), at1));
  EXPECT_EQ(f.hybrid_cache->metrics().lookup_hits.value(), 2u);
  EXPECT_EQ(f.hybrid_cache->metrics().snapshots_stored.value(), 2u);
  EXPECT_EQ(f.hybrid_cache->metrics().snapshot_bytes_stored.value(), 2 * at1.size());

  // Another prompt's block 3 has the same position but other tokens: no snapshot of its own.
  const auto other_tokens = prompt(4 * 6, 2);
  const auto other = h.keys(other_tokens, {});
  EXPECT_FALSE(f.hybrid_cache->has_snapshot(other, 3));
  auto missing = f.hybrid_cache->fetch_snapshot(other, 3);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(f.hybrid_cache->metrics().snapshot_read_failures.value(), 1u);
}

TEST(HybridPrefixCacheTest, ASnapshotOfTheWrongSizeIsRefusedAndCounted) {
  Fixture f({ram(1 << 20)});
  auto h = small_hasher();
  const auto tokens = prompt(8, 1);
  const auto keys = h.keys(tokens, {});
  const AlignedBuffer s = snapshot(1);
  auto r = f.hybrid_cache->store_snapshot(keys, 1, {}, s.span().first(s.size() - 4));
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f.hybrid_cache->store_snapshot(keys, 2, {}, s.span()).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f.hybrid_cache->metrics().snapshots_refused.value(), 1u);
  EXPECT_FALSE(f.hybrid_cache->has_snapshot(keys, 1));
}

TEST(HybridPrefixCacheTest, SnapshotsComeBackFromTheSsdAfterARestartBitForBit) {
  testing::TempDir dir;
  auto h = small_hasher();
  const auto tokens = prompt(4 * 5, 7);
  const auto keys = h.keys(tokens, {});
  const AlignedBuffer at4 = snapshot(4);
  {
    auto registry = std::make_shared<LayoutRegistry>();
    ASSERT_TRUE(registry->add(*testing::small_layout()).ok());
    auto ssd = std::shared_ptr<SsdTier>(std::move(SsdTier::open(testing::small_ssd_options(dir.str()), registry)).value());
    TieredCache cache({ram(1 << 20), ssd});
    auto hc = std::move(HybridPrefixCache::create(cache, h, hybrid(), *registry)).value();
    // Straight into the SSD tier, as a spill would write them.
    for (size_t i = 0; i < keys.size(); ++i) ASSERT_TRUE(ssd->insert(computed_block(h, keys, i)).ok());
    const std::vector<BlockKey> prefix(keys.begin(), keys.end());
    auto record = make_state_record(hybrid(), hc->snapshot_layout(), h.identity(prefix, 4, {}),
                                    h.snapshot_key(keys[4].hash), 20, at4.span());
    ASSERT_TRUE(record.ok());
    ASSERT_TRUE(ssd->insert(std::make_shared<const Block>(std::move(*record))).ok());
    ssd->flush();
  }
  // A new process: the tiers reopened from the directory.
  auto registry = std::make_shared<LayoutRegistry>();
  ASSERT_TRUE(registry->add(*testing::small_layout()).ok());
  auto ssd_result = SsdTier::open(testing::small_ssd_options(dir.str()), registry);
  ASSERT_TRUE(ssd_result.ok()) << ssd_result.status().to_string();
  auto ssd = std::shared_ptr<SsdTier>(std::move(ssd_result).value());
  auto top = ram(1 << 20);
  TieredCache cache({top, ssd});
  auto hc = std::move(HybridPrefixCache::create(cache, h, hybrid(), *registry)).value();
  HybridLookup r = hc->lookup(keys);
  EXPECT_EQ(r.blocks, 5u);
  EXPECT_EQ(r.hits[4].tier, 1);
  auto back = hc->fetch_snapshot(keys, 4);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_TRUE(same(*back, at4));
  // Read once from the SSD, it is kept in RAM for the next hit.
  EXPECT_TRUE(top->contains(h.snapshot_key(keys[4].hash)));
}

TEST(HybridPrefixCacheTest, ASnapshotNeverOutlivesItsBlock) {
  auto h = small_hasher();
  const uint64_t block = computed_block(h, h.keys(prompt(4, 1), {}), 0)->size_bytes();
  // Room for the prompt's 3 blocks and its snapshot record (padded f32, larger than a block).
  auto record_bytes = [&] {
    LayoutRegistry l;
    auto layout = l.add(snapshot_layout(hybrid()));
    const auto t = prompt(4, 1);
    const auto k = h.keys(t, {});
    return make_state_record(hybrid(), *layout, h.identity(k, 0, {}), h.snapshot_key(k[0].hash), 4, snapshot(1).span())
        ->size_bytes();
  }();
  Fixture f({ram(3 * block + record_bytes)});
  const auto tokens = prompt(12, 1);
  const auto keys = h.keys(tokens, {});
  for (size_t i = 0; i < 3; ++i) ASSERT_TRUE(f.cache.insert(computed_block(h, keys, i)).ok());
  ASSERT_TRUE(f.hybrid_cache->store_snapshot(keys, 2, {}, snapshot(2).span()).ok());
  ASSERT_EQ(f.hybrid_cache->lookup(keys).blocks, 3u);

  // Other prompts' blocks push the chain out. Chain-aware LRU takes the snapshot (a leaf: its
  // parent is block 2) before the blocks it needs; had block 2 gone first, the snapshot would
  // have gone with it.
  const auto more_tokens = prompt(4 * 8, 9);
  const auto more = h.keys(more_tokens, {});
  for (size_t i = 0; i < more.size(); ++i) ASSERT_TRUE(f.cache.insert(computed_block(h, more, i)).ok());
  EXPECT_FALSE(f.hybrid_cache->has_snapshot(keys, 2));
  EXPECT_EQ(f.hybrid_cache->lookup(keys).blocks, 0u);
  EXPECT_EQ(f.hybrid_cache->metrics().snapshots_evicted.value() +
                f.hybrid_cache->metrics().snapshots_erased_with_block.value(),
            1u);

  // The block goes first: the snapshot sits in the top tier, its blocks in the last one, and new
  // blocks push them out of it. The snapshot is erased with its block.
  Fixture g({ram(1 << 20), ram(3 * block)});
  for (size_t i = 0; i < 3; ++i) ASSERT_TRUE(g.cache.tiers()[1]->insert(computed_block(h, keys, i)).ok());
  ASSERT_TRUE(g.hybrid_cache->store_snapshot(keys, 2, {}, snapshot(2).span()).ok());
  ASSERT_TRUE(g.cache.tiers()[0]->contains(h.snapshot_key(keys[2].hash)));
  // Three new blocks in the last tier push out the prompt's: each falls off the last local tier.
  for (size_t i = 0; i < 3; ++i) ASSERT_TRUE(g.cache.tiers()[1]->insert(computed_block(h, more, i)).ok());
  EXPECT_FALSE(g.cache.tiers()[1]->contains(keys[2].hash));
  EXPECT_FALSE(g.hybrid_cache->has_snapshot(keys, 2));
  EXPECT_EQ(g.hybrid_cache->metrics().snapshots_erased_with_block.value(), 1u);
}

}  // namespace
}  // namespace kvtier
