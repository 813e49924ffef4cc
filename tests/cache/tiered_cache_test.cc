#include "cache/tiered_cache.h"

#include <random>

#include <gtest/gtest.h>

#include "tests/cache/cache_test_blocks.h"
#include "tests/engine/engine_test_env.h"
#include "tiers/gpu_tier.h"
#include "tiers/ram_tier.h"

namespace kvtier {
namespace {

using testing::computed_block;
using testing::prompt;
using testing::small_hasher;

uint64_t block_bytes() {
  auto h = small_hasher();
  const auto t = prompt(4, 1);
  return computed_block(h, h.keys(t, {}), 0)->size_bytes();
}

std::shared_ptr<RamTier> ram(uint64_t blocks, std::string name = "ram") {
  RamTierOptions o;
  o.capacity_bytes = blocks * block_bytes();
  o.name = std::move(name);
  o.eviction = "lru";  // these tests spell out the cascade in LRU's order; policies have their own
  return std::make_shared<RamTier>(o);
}

// A GPU tier of `gpu_blocks` over a RAM tier of `ram_blocks`, as a GPU hit's tests need them.
struct GpuOverRam {
  std::unique_ptr<GpuBlockPool> pool;
  std::shared_ptr<GpuTier> top;
  std::shared_ptr<RamTier> lower;
  std::unique_ptr<TieredCache> cache;
};

GpuOverRam gpu_over_ram(uint32_t gpu_blocks, uint64_t ram_blocks) {
  GpuOverRam g;
  g.pool = std::move(GpuBlockPool::create(testing::gpu(), testing::small_layout(), {gpu_blocks, 0}))
               .value();
  g.top = std::move(GpuTier::create(testing::gpu(), *g.pool)).value();
  g.lower = ram(ram_blocks);
  g.cache = std::make_unique<TieredCache>(std::vector<std::shared_ptr<Tier>>{g.top, g.lower});
  return g;
}

void publish(TieredCache& cache, const PrefixHasher& h, const std::vector<BlockKey>& keys,
             size_t count) {
  for (size_t i = 0; i < count; ++i) ASSERT_TRUE(cache.insert(computed_block(h, keys, i)).ok());
}

// The first `on_gpu` blocks of `keys` published (onto the GPU), the next `in_ram` in RAM alone.
void place(GpuOverRam& g, const PrefixHasher& h, const std::vector<BlockKey>& keys, size_t on_gpu,
           size_t in_ram) {
  publish(*g.cache, h, keys, on_gpu);
  for (size_t i = on_gpu; i < on_gpu + in_ram; ++i) {
    ASSERT_TRUE(g.lower->insert(computed_block(h, keys, i)).ok());
  }
}

TEST(TieredCacheTest, LookupFindsTheLongestPrefixAndStopsAtTheFirstMiss) {
  auto h = small_hasher();
  TieredCache cache({ram(100)});
  auto tokens = prompt(4 * 6 + 3, 1);  // 6 full blocks and a partial one
  auto keys = h.keys(tokens, {});
  publish(cache, h, keys, 3);
  ASSERT_TRUE(cache.insert(computed_block(h, keys, 4)).ok());  // a hole at block 3

  LookupResult r = cache.lookup(h, tokens, {});
  EXPECT_EQ(r.matched_tokens, 12u);
  ASSERT_EQ(r.blocks.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(r.blocks[i].hash, keys[i].hash);
    EXPECT_EQ(r.blocks[i].tier, 0);
  }
  EXPECT_EQ(cache.metrics().hit_tokens[0].value(), 12u);
  EXPECT_EQ(cache.lookup(h, prompt(40, 2), {}).matched_tokens, 0u);
}

// Lookups ask the tiers a window of blocks at a time (windows of 4, 8, 16, ...): the chain must
// still end exactly at its first hole, wherever that falls in a window, with each block credited
// to the highest tier holding it.
TEST(TieredCacheTest, LookupStopsAtTheFirstHoleAcrossWindowsAndTiers) {
  auto h = small_hasher();
  auto tokens = prompt(4 * 100, 3);
  auto keys = h.keys(tokens, {});
  for (size_t hole : {0u, 3u, 4u, 5u, 11u, 12u, 27u, 60u, 99u, 100u}) {
    auto top = ram(200, "top"), low = ram(200, "low");
    TieredCache cache({top, low});
    for (size_t i = 0; i < keys.size(); ++i) {
      if (i == hole) continue;
      auto b = computed_block(h, keys, i);
      ASSERT_TRUE((i % 3 == 0 ? top : low)->insert(b).ok());
      if (i % 5 == 0) {
        ASSERT_TRUE(low->insert(b).ok());  // in both: the top one counts
      }
    }
    LookupResult r = cache.lookup(h, tokens, {});
    ASSERT_EQ(r.blocks.size(), std::min(hole, keys.size())) << "hole at " << hole;
    for (size_t i = 0; i < r.blocks.size(); ++i) {
      EXPECT_EQ(r.blocks[i].hash, keys[i].hash);
      EXPECT_EQ(r.blocks[i].tier, i % 3 == 0 ? 0 : 1) << "block " << i;
    }
  }
}

TEST(TieredCacheTest, PublishingTheSameBlockTwiceIsANoOp) {
  auto h = small_hasher();
  TieredCache cache({ram(10)});
  auto tokens = prompt(8, 1);
  auto keys = h.keys(tokens, {});
  ASSERT_EQ(*cache.insert(computed_block(h, keys, 0)), InsertOutcome::kInserted);
  ASSERT_EQ(*cache.insert(computed_block(h, keys, 0)), InsertOutcome::kAlreadyPresent);
  EXPECT_EQ(cache.metrics().duplicate_inserts.value(), 1u);
  EXPECT_EQ(cache.tiers()[0]->block_count(), 1u);
}

TEST(TieredCacheTest, DifferentTokensUnderAStoredHashAreRejectedAsACollision) {
  auto h = small_hasher();
  auto lower = ram(10, "ram1");
  TieredCache cache({ram(10), lower});
  const auto tokens = prompt(8, 1);
  auto keys = h.keys(tokens, {});
  auto genuine = computed_block(h, keys, 0);
  ASSERT_TRUE(lower->insert(genuine).ok());  // held below the top tier
  Block forged = genuine->clone();
  forged.mutable_identity().token_ids[2] += 7;  // same hash, other tokens
  auto r = cache.insert(std::make_shared<const Block>(std::move(forged)));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kConflict);
  EXPECT_EQ(cache.metrics().collisions.value(), 1u);
  EXPECT_EQ(cache.tiers()[0]->block_count(), 0u);
  auto held = lower->read({genuine->hash(), genuine->identity().token_ids});
  ASSERT_TRUE(held.ok());
  EXPECT_EQ((*held)->identity().token_ids, genuine->identity().token_ids) << "nothing changed";
}

TEST(TieredCacheTest, FetchPromotesFromBelowAndPinsUntilReleased) {
  auto h = small_hasher();
  auto top = ram(3, "ram0");
  auto lower = ram(20, "ram1");
  TieredCache cache({top, lower});
  const auto tokens = prompt(4 * 3, 1);
  auto keys = h.keys(tokens, {});
  for (size_t i = 0; i < 3; ++i) ASSERT_TRUE(lower->insert(computed_block(h, keys, i)).ok());

  {
    PinnedBlocks pinned = cache.fetch(keys);
    ASSERT_EQ(pinned.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(pinned.entries()[i].source_tier, 1);
      EXPECT_TRUE(pinned.entries()[i].pinned);
      EXPECT_TRUE(top->contains(keys[i].hash)) << "promoted";
      EXPECT_TRUE(testing::same_bytes(*pinned.entries()[i].block, *computed_block(h, keys, i)));
    }
    EXPECT_EQ(cache.metrics().promotions.value(), 3u);
    // Pressure on the full top tier cannot evict pinned blocks: the new block goes below instead.
    const auto other_tokens = prompt(4, 9);
    auto other = h.keys(other_tokens, {});
    ASSERT_TRUE(cache.insert(computed_block(h, other, 0)).ok());
    for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(top->contains(keys[i].hash));
    EXPECT_TRUE(lower->contains(other[0].hash));
  }
  EXPECT_EQ(top->unpinned_count(), 3u) << "released: all three evictable again";
  auto again = cache.fetch(keys);
  EXPECT_EQ(again.entries()[0].source_tier, 0) << "now served from the top tier";
}

TEST(TieredCacheTest, EvictionCascadesThroughTwoRamTiersAndDropsFromTheLast) {
  auto h = small_hasher();
  auto top = ram(4, "ram0");
  auto lower = ram(10, "ram1");
  TieredCache cache({top, lower});
  const auto tokens = prompt(4 * 30, 1);
  auto keys = h.keys(tokens, {});
  publish(cache, h, keys, 30);
  EXPECT_EQ(top->block_count(), 4u);
  EXPECT_EQ(lower->block_count(), 10u);
  EXPECT_LE(top->used_bytes(), top->capacity_bytes());
  EXPECT_LE(lower->used_bytes(), lower->capacity_bytes());
  // The most recent 4 are on top, the 10 before them below, the oldest 16 dropped and counted.
  for (size_t i = 26; i < 30; ++i) EXPECT_TRUE(top->contains(keys[i].hash)) << i;
  for (size_t i = 16; i < 26; ++i) EXPECT_TRUE(lower->contains(keys[i].hash)) << i;
  EXPECT_EQ(cache.metrics().evictions[0].value(), 26u);
  EXPECT_EQ(cache.metrics().dropped_evicted_from_last_tier.value(), 16u);
  // A lookup sees where each block is; the prefix starts missing at block 0 (dropped).
  EXPECT_EQ(cache.lookup(keys).matched_tokens, 0u);
  std::vector<BlockKey> tail(keys.begin() + 16, keys.end());
  LookupResult r = cache.lookup(tail);
  ASSERT_EQ(r.blocks.size(), 14u);
  EXPECT_EQ(r.blocks[0].tier, 1);
  EXPECT_EQ(r.blocks[13].tier, 0);
}

TEST(TieredCacheTest, AnEvictedBlockTooLargeForTheNextTierGoesFurtherDown) {
  auto h = small_hasher();
  auto top = ram(2, "ram0");
  RamTierOptions tiny;
  tiny.capacity_bytes = block_bytes() / 2;  // holds nothing
  tiny.name = "ram1";
  auto middle = std::make_shared<RamTier>(tiny);
  auto bottom = ram(10, "ram2");
  TieredCache cache({top, middle, bottom});
  const auto tokens = prompt(4 * 5, 1);
  auto keys = h.keys(tokens, {});
  publish(cache, h, keys, 5);
  EXPECT_EQ(middle->block_count(), 0u);
  EXPECT_EQ(bottom->block_count(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(bottom->contains(keys[i].hash)) << i;
  EXPECT_EQ(cache.metrics().dropped_lower_tier_refused.value(), 0u);
  EXPECT_EQ(cache.lookup(keys).matched_tokens, 4u * 5);
}

TEST(TieredCacheTest, ABlockWhoseTokensDifferFromTheRequestIsNeverServed) {
  auto h = small_hasher();
  auto top = ram(10, "ram0");
  auto lower = ram(10, "ram1");
  TieredCache cache({top, lower});
  const auto tokens = prompt(12, 1);
  auto keys = h.keys(tokens, {});
  ASSERT_TRUE(lower->insert(computed_block(h, keys, 0)).ok());
  Block bad = computed_block(h, keys, 1)->clone();
  bad.mutable_identity().token_ids[0] += 1;  // stored under keys[1]'s hash, wrong tokens
  ASSERT_TRUE(lower->insert(std::make_shared<const Block>(std::move(bad))).ok());
  ASSERT_TRUE(lower->insert(computed_block(h, keys, 2)).ok());

  PinnedBlocks got = cache.fetch(keys);
  EXPECT_EQ(got.size(), 1u) << "the prefix ends before the mismatched block";
  EXPECT_EQ(cache.metrics().token_mismatches[1].value(), 1u);
  EXPECT_FALSE(top->contains(keys[1].hash)) << "a mismatched block is not promoted";
}

// A GPU hit is located once (lookup) and pinned in one pass (fetch of what it found). What
// changed in between is still caught: a block evicted from the GPU since is read where it went
// and uploaded again, and a GPU block under the right hash with other tokens ends the prefix.
TEST(TieredCacheTest, AFetchOfWhatALookupFoundFollowsMovedBlocksAndChecksTokensOnTheGpu) {
  auto h = small_hasher();
  GpuOverRam g = gpu_over_ram(8, 10);
  auto& [pool, top, lower, cache_ptr] = g;
  TieredCache& cache = *cache_ptr;
  const auto tokens = prompt(4 * 5, 1);
  auto keys = h.keys(tokens, {});
  for (size_t i = 0; i < 3; ++i) ASSERT_TRUE(cache.insert(computed_block(h, keys, i)).ok());
  Block bad = computed_block(h, keys, 3)->clone();
  bad.mutable_identity().token_ids[0] += 1;  // on the GPU under keys[3]'s hash, wrong tokens
  ASSERT_TRUE(top->insert(std::make_shared<const Block>(std::move(bad))).ok());
  ASSERT_TRUE(cache.insert(computed_block(h, keys, 4)).ok());
  ASSERT_TRUE(lower->insert(computed_block(h, keys, 1)).ok());

  const LookupResult found = cache.lookup(keys);
  ASSERT_EQ(found.blocks.size(), 5u);
  for (const auto& hit : found.blocks) EXPECT_EQ(hit.tier, 0);
  ASSERT_TRUE(top->erase(keys[1].hash));  // gone from the GPU after the lookup; RAM has it
  {
    PinnedBlocks got = cache.fetch(keys, found);
    ASSERT_EQ(got.size(), 3u) << "the prefix ends at the block whose tokens differ";
    EXPECT_EQ(got.entries()[0].source_tier, 0);
    EXPECT_EQ(got.entries()[0].device_slot, top->device_slot(keys[0].hash).value_or(-2));
    EXPECT_EQ(got.entries()[1].source_tier, 1) << "read where it went";
    EXPECT_TRUE(testing::same_bytes(*got.entries()[1].block, *computed_block(h, keys, 1)));
    EXPECT_EQ(got.entries()[1].device_slot, top->device_slot(keys[1].hash).value_or(-2)) << "uploaded again";
    EXPECT_EQ(got.entries()[2].source_tier, 0);
    for (const auto& e : got.entries()) EXPECT_TRUE(e.pinned);
    EXPECT_EQ(cache.metrics().relocated.value(), 1u);
    EXPECT_EQ(cache.metrics().token_mismatches[0].value(), 1u);
    EXPECT_EQ(pool->blocks_in_use(), 3u) << "the three served blocks pinned, none past the prefix";
  }
  EXPECT_EQ(pool->blocks_in_use(), 0u) << "released";
}

// A lookup for a request about to be served pins the GPU's prefix as it finds it: the same
// answer as lookup(), the GPU blocks pinned with their slots (what fetch() of them would give), the
// rest found below and left unpinned; a prompt the GPU does not hold pins nothing; a GPU block
// under the right hash with other tokens ends the prefix, unserved and counted.
TEST(TieredCacheTest, ALookupPinningTheTopTierPinsTheGpusPrefixAsItFindsIt) {
  auto h = small_hasher();
  GpuOverRam g = gpu_over_ram(16, 20);
  auto& [pool, top, lower, cache_ptr] = g;
  TieredCache& cache = *cache_ptr;
  const auto tokens = prompt(4 * 8, 1);
  auto keys = h.keys(tokens, {});
  place(g, h, keys, 5, 2);
  const LookupResult plain = cache.lookup(keys);
  {
    TieredCache::PinnedLookup got = cache.lookup_pinning_top(keys);
    ASSERT_EQ(got.found.blocks.size(), 7u);
    EXPECT_EQ(got.found.matched_tokens, plain.matched_tokens);
    for (size_t i = 0; i < 7; ++i) {
      EXPECT_EQ(got.found.blocks[i].hash, plain.blocks[i].hash);
      EXPECT_EQ(got.found.blocks[i].tier, i < 5 ? 0 : 1);
    }
    ASSERT_EQ(got.on_top.size(), 5u);
    for (size_t i = 0; i < 5; ++i) {
      const auto& e = got.on_top.entries()[i];
      EXPECT_EQ(e.hash, keys[i].hash);
      EXPECT_TRUE(e.pinned);
      EXPECT_EQ(e.source_tier, 0);
      EXPECT_EQ(e.device_slot, top->device_slot(keys[i].hash).value_or(-2));
    }
    EXPECT_EQ(pool->blocks_in_use(), 5u) << "the GPU's five pinned, nothing else";
    EXPECT_EQ(cache.metrics().hit_blocks[0].value(), 10u);  // this lookup's and the plain one's
    EXPECT_EQ(cache.metrics().hit_blocks[1].value(), 4u);
    EXPECT_EQ(cache.metrics().fetched_blocks[0].value(), 5u);
  }
  EXPECT_EQ(pool->blocks_in_use(), 0u) << "released";

  // Only RAM holds this one: nothing stays pinned on the GPU.
  const auto other = prompt(4 * 3, 2);
  auto other_keys = h.keys(other, {});
  for (size_t i = 0; i < 3; ++i) ASSERT_TRUE(lower->insert(computed_block(h, other_keys, i)).ok());
  {
    TieredCache::PinnedLookup got = cache.lookup_pinning_top(other_keys);
    EXPECT_EQ(got.on_top.size(), 0u);
    ASSERT_EQ(got.found.blocks.size(), 3u);
    for (const auto& hit : got.found.blocks) EXPECT_EQ(hit.tier, 1);
    EXPECT_EQ(pool->blocks_in_use(), 0u);
  }

  // Block 2 on the GPU under its hash with other tokens.
  ASSERT_TRUE(top->erase(keys[2].hash));
  Block bad = computed_block(h, keys, 2)->clone();
  bad.mutable_identity().token_ids[0] += 1;
  ASSERT_TRUE(top->insert(std::make_shared<const Block>(std::move(bad))).ok());
  {
    TieredCache::PinnedLookup got = cache.lookup_pinning_top(keys);
    EXPECT_EQ(got.on_top.size(), 2u);
    EXPECT_EQ(got.found.blocks.size(), 2u) << "the prefix ends at the block whose tokens differ";
    EXPECT_EQ(cache.metrics().token_mismatches[0].value(), 1u);
    EXPECT_EQ(pool->blocks_in_use(), 2u) << "the two served blocks pinned, none past the prefix";
  }
  EXPECT_EQ(pool->blocks_in_use(), 0u);
}

// A caller whose plan could not use the lower tiers' blocks stops the lookup at the top tier: it
// is told how many blocks the top tier pinned, and answering false leaves RAM's blocks unfound
// and uncounted (and the lookup counted as stopped); answering true finds them as before.
TEST(TieredCacheTest, ALookupPinningTheTopTierStopsThereWhenItsCallerSaysSo) {
  auto h = small_hasher();
  GpuOverRam g = gpu_over_ram(16, 20);
  auto& [pool, top, lower, cache_ptr] = g;
  TieredCache& cache = *cache_ptr;
  const auto tokens = prompt(4 * 6, 3);
  auto keys = h.keys(tokens, {});
  place(g, h, keys, 2, 4);
  EXPECT_EQ(cache.tier_holding(keys[1].hash), 0);
  EXPECT_EQ(cache.tier_holding(keys[2].hash), 1);
  EXPECT_EQ(cache.tier_holding(h.keys(prompt(4, 9), {})[0].hash), -1);
  std::vector<size_t> asked;
  {
    TieredCache::PinnedLookup got = cache.lookup_pinning_top(keys, [&](size_t on_top) {
      asked.push_back(on_top);
      return false;
    });
    EXPECT_TRUE(got.stopped_at_top);
    ASSERT_EQ(got.found.blocks.size(), 2u) << "the GPU's prefix alone";
    EXPECT_EQ(got.on_top.size(), 2u);
    EXPECT_EQ(cache.metrics().hit_blocks[1].value(), 0u) << "RAM was not asked";
    EXPECT_EQ(cache.metrics().lookups_stopped_at_top.value(), 1u);
  }
  {
    TieredCache::PinnedLookup got = cache.lookup_pinning_top(keys, [&](size_t on_top) {
      asked.push_back(on_top);
      return true;
    });
    EXPECT_FALSE(got.stopped_at_top);
    ASSERT_EQ(got.found.blocks.size(), 6u);
    EXPECT_EQ(got.found.blocks[5].tier, 1);
    EXPECT_EQ(cache.metrics().lookups_stopped_at_top.value(), 1u);
  }
  EXPECT_EQ(asked, (std::vector<size_t>{2, 2}));
  // A prompt the GPU holds whole asks nothing: there is nothing below to find.
  const auto two = std::vector<BlockKey>(keys.begin(), keys.begin() + 2);
  EXPECT_FALSE(cache
                   .lookup_pinning_top(two,
                                       [&](size_t on_top) {
                                         asked.push_back(on_top);
                                         return false;
                                       })
                   .stopped_at_top);
  EXPECT_EQ(asked.size(), 2u);
  EXPECT_EQ(pool->blocks_in_use(), 0u);
}

TEST(TieredCacheTest, RandomOperationsKeepEveryTierWithinCapacity) {
  auto h = small_hasher();
  auto top = ram(7, "ram0");
  auto lower = ram(23, "ram1");
  TieredCache cache({top, lower});
  std::vector<std::vector<uint32_t>> prompts;
  for (uint32_t p = 0; p < 20; ++p) prompts.push_back(prompt(4 * (1 + p % 6), p));
  std::mt19937 rng(5);
  std::vector<PinnedBlocks> held;
  for (int op = 0; op < 100'000; ++op) {
    const auto& tokens = prompts[rng() % prompts.size()];
    auto keys = h.keys(tokens, {});
    switch (rng() % 4) {
      case 0: {
        size_t i = rng() % keys.size();
        auto r = cache.insert(computed_block(h, keys, i));
        ASSERT_TRUE(r.ok() || r.status().code() == StatusCode::kResourceExhausted) << r.status().to_string();
        break;
      }
      case 1: {
        LookupResult r = cache.lookup(keys);
        for (const auto& hit : r.blocks) ASSERT_TRUE(cache.tiers()[hit.tier]->contains(hit.hash));
        break;
      }
      case 2:
        held.push_back(cache.fetch(keys));
        if (held.size() > 2) held.erase(held.begin());
        for (const auto& e : held.back().entries()) {
          ASSERT_EQ(e.block->identity().token_ids,
                    std::vector<uint32_t>(keys[&e - &held.back().entries()[0]].tokens.begin(),
                                          keys[&e - &held.back().entries()[0]].tokens.end()));
        }
        break;
      case 3:
        held.clear();
        break;
    }
    ASSERT_LE(top->used_bytes(), top->capacity_bytes()) << "op " << op;
    ASSERT_LE(lower->used_bytes(), lower->capacity_bytes()) << "op " << op;
  }
  held.clear();
  EXPECT_EQ(top->metrics().pinned_blocks.value(), 0);
}

}  // namespace
}  // namespace kvtier
