// Six threads storing blocks and state snapshots, looking up and restoring hybrid prefixes at once
// through two RAM tiers small enough that blocks and snapshots are evicted and dropped all the
// while (snapshots erased with their blocks on the drop listeners). Run under TSan (`make test
// SANITIZE=thread`): every restored snapshot must be the bytes stored for its block.
#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cache/hybrid_prefix_cache.h"
#include "tests/cache/cache_test_blocks.h"
#include "tiers/ram_tier.h"

namespace kvtier {
namespace {

using testing::computed_block;

HybridLayout hybrid() {
  nlohmann::json j = {{"name", "small-hybrid"}, {"block_size", 4}, {"dtype", "BF16"},
                      {"attention", {{"num_kv_heads", 1}, {"head_dim", 8}}},
                      {"gdn", {{"heads", 1}, {"d_k", 8}, {"d_v", 8}, {"conv_width", 2}, {"conv_channels", 8}}},
                      {"pattern", {"gdn", "attention"}}};
  return std::move(HybridLayout::from_json(j)).value();
}

// The snapshot a writer stores at the end of `block`: derived from its hash, so any reader can
// tell it is the right one.
std::vector<uint8_t> snapshot_for(const BlockHash& block, size_t bytes) {
  std::vector<uint8_t> s(bytes);
  for (size_t i = 0; i < bytes; ++i) s[i] = static_cast<uint8_t>(block.bytes[i % BlockHash::kSize] + i / 32);
  return s;
}

TEST(HybridPrefixCacheConcurrencyTest, SixThreadsStoreAndRestoreWhileEvictionsDropSnapshots) {
  auto h = testing::small_hasher();
  const uint64_t bb = computed_block(h, h.keys(testing::prompt(4, 1), {}), 0)->size_bytes();
  RamTierOptions o0, o1;
  o0.capacity_bytes = 60 * bb;
  o0.name = "ram0";
  o1.capacity_bytes = 120 * bb;
  o1.name = "ram1";
  o0.eviction = o1.eviction = "chain-lru";
  auto top = std::make_shared<RamTier>(o0);
  auto lower = std::make_shared<RamTier>(o1);
  TieredCache cache({top, lower});
  LayoutRegistry layouts;
  auto hc = std::move(HybridPrefixCache::create(cache, h, hybrid(), layouts)).value();
  const size_t snapshot_bytes = hybrid().snapshot_bytes();

  std::vector<std::vector<uint32_t>> prompts;
  for (uint32_t p = 0; p < 48; ++p) prompts.push_back(testing::prompt(4 * (2 + p % 6), p));
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> ops{0}, restored{0}, wrong{0};

  auto worker = [&](int id) {
    std::mt19937 rng(id);
    while (!stop.load(std::memory_order_relaxed)) {
      const auto& tokens = prompts[rng() % prompts.size()];
      const auto keys = h.keys(tokens, {});
      if (rng() % 2 == 0) {  // compute: store the blocks, then a snapshot at the end of one
        for (size_t i = 0; i < keys.size(); ++i) (void)cache.insert(computed_block(h, keys, i));
        const size_t at = rng() % keys.size();
        (void)hc->store_snapshot(keys, at, {}, snapshot_for(keys[at].hash, snapshot_bytes));
      } else {  // restore
        const HybridLookup found = hc->lookup(keys);
        if (found.blocks > 0) {
          auto s = hc->fetch_snapshot(keys, found.blocks - 1);  // may be gone meanwhile: a miss
          if (s.ok()) {
            restored.fetch_add(1);
            const auto want = snapshot_for(keys[found.blocks - 1].hash, snapshot_bytes);
            if (s->size() != want.size() || std::memcmp(s->data(), want.data(), want.size()) != 0) wrong.fetch_add(1);
          }
        }
      }
      ops.fetch_add(1, std::memory_order_relaxed);
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < 6; ++i) threads.emplace_back(worker, i);
  std::this_thread::sleep_for(std::chrono::seconds(3));
  stop = true;
  for (auto& t : threads) t.join();

  EXPECT_GT(ops.load(), 500u);
  EXPECT_GT(restored.load(), 0u);
  EXPECT_EQ(wrong.load(), 0u) << "every restored snapshot was the one stored for its block";
  const HybridCacheMetrics& m = hc->metrics();
  EXPECT_GT(m.snapshots_evicted.value() + m.snapshots_erased_with_block.value(), 0u)
      << "the tiers were small enough to drop snapshots";
  EXPECT_LE(top->used_bytes(), top->capacity_bytes());
  EXPECT_LE(lower->used_bytes(), lower->capacity_bytes());
}

}  // namespace
}  // namespace kvtier
