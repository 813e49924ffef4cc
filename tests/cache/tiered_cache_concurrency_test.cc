// Eight threads looking up, publishing and fetching at once against two RAM tiers. Run under TSan
// (`make test SANITIZE=thread`); the invariants are checked while it runs and after.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "cache/tiered_cache.h"
#include "tests/cache/cache_test_blocks.h"
#include "tests/engine/engine_test_env.h"
#include "tiers/gpu_tier.h"
#include "tiers/ram_tier.h"

namespace kvtier {
namespace {

using testing::computed_block;

// Every eviction policy: they run under the tier's lock, and this is where a data race would show.
class TieredCacheConcurrencyTest : public ::testing::TestWithParam<const char*> {};

TEST_P(TieredCacheConcurrencyTest, EightThreadsOfLookupInsertFetchKeepTheInvariants) {
  auto h = testing::small_hasher();
  const auto first = testing::prompt(4, 1);
  const uint64_t bb = computed_block(h, h.keys(first, {}), 0)->size_bytes();
  RamTierOptions o0, o1;
  o0.capacity_bytes = 40 * bb;
  o0.name = "ram0";
  o1.capacity_bytes = 150 * bb;
  o1.name = "ram1";
  o0.eviction = o1.eviction = GetParam();
  auto top = std::make_shared<RamTier>(o0);
  auto lower = std::make_shared<RamTier>(o1);
  TieredCache cache({top, lower});

  std::vector<std::vector<uint32_t>> prompts;
  for (uint32_t p = 0; p < 64; ++p) prompts.push_back(testing::prompt(4 * (1 + p % 8), p));
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> ops{0}, wrong{0}, over_capacity{0};

  auto worker = [&](int id) {
    std::mt19937 rng(id);
    while (!stop.load(std::memory_order_relaxed)) {
      const auto& tokens = prompts[rng() % prompts.size()];
      auto keys = h.keys(tokens, {});
      switch (rng() % 3) {
        case 0:
          (void)cache.insert(computed_block(h, keys, rng() % keys.size()));
          break;
        case 1:
          (void)cache.lookup(keys);
          break;
        case 2: {
          PinnedBlocks got = cache.fetch(keys);
          for (size_t i = 0; i < got.size(); ++i) {
            const auto& e = got.entries()[i];
            if (!std::equal(keys[i].tokens.begin(), keys[i].tokens.end(),
                            e.block->identity().token_ids.begin()) ||
                !testing::same_bytes(*e.block, *computed_block(h, keys, i))) {
              wrong.fetch_add(1);
            }
          }
          break;
        }
      }
      if (top->used_bytes() > top->capacity_bytes() || lower->used_bytes() > lower->capacity_bytes()) {
        over_capacity.fetch_add(1);
      }
      ops.fetch_add(1, std::memory_order_relaxed);
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) threads.emplace_back(worker, i);
  std::this_thread::sleep_for(std::chrono::seconds(3));
  stop = true;
  for (auto& t : threads) t.join();

  EXPECT_GT(ops.load(), 1000u);
  EXPECT_EQ(wrong.load(), 0u) << "every fetched block carried the requested tokens and bytes";
  EXPECT_EQ(over_capacity.load(), 0u);
  EXPECT_EQ(top->metrics().pinned_blocks.value(), 0) << "every pin released";
  EXPECT_EQ(top->unpinned_count(), top->block_count());
  // Byte accounting agrees with what is held.
  uint64_t sum = 0;
  for (const BlockRef& b : top->blocks()) sum += b->size_bytes();
  EXPECT_EQ(sum, top->used_bytes());
}

// The same with the GPU on top, where fetches pin their prefix in one pass (GpuTier::pin_many)
// while other threads publish, evict and release: every block a fetch hands out is pinned at a
// slot that holds its tokens for as long as it is held, and every pin comes back.
TEST(TieredCacheGpuConcurrencyTest, FetchesPinningGpuPrefixesWhileOthersEvictKeepTheInvariants) {
  auto h = testing::small_hasher();
  auto pool = std::move(GpuBlockPool::create(testing::gpu(), testing::small_layout(), {24, 0})).value();
  std::shared_ptr<GpuTier> top = std::move(GpuTier::create(testing::gpu(), *pool)).value();
  RamTierOptions o;
  o.capacity_bytes = 200 * computed_block(h, h.keys(testing::prompt(4, 1), {}), 0)->size_bytes();
  TieredCache cache({top, std::make_shared<RamTier>(o)});

  std::vector<std::vector<uint32_t>> prompts;
  for (uint32_t p = 0; p < 32; ++p) prompts.push_back(testing::prompt(4 * (1 + p % 6), p));
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> fetched{0}, wrong{0}, unpinned{0};
  auto worker = [&](int id) {
    std::mt19937 rng(id);
    while (!stop.load(std::memory_order_relaxed)) {
      const auto& tokens = prompts[rng() % prompts.size()];
      auto keys = h.keys(tokens, {});
      if (rng() % 2 == 0) {
        (void)cache.insert(computed_block(h, keys, rng() % keys.size()));
        continue;
      }
      const LookupResult found = cache.lookup(keys);
      PinnedBlocks got = cache.fetch(std::span(keys).first(found.blocks.size()), found);
      for (size_t i = 0; i < got.size(); ++i) {
        const auto& e = got.entries()[i];
        // A block promoted from RAM into a GPU full of others' pins is handed out unpinned, on the
        // host (PinnedBlocks' contract); every other one is pinned at a slot holding its tokens.
        const auto held = e.pinned && e.device_slot >= 0 ? pool->identity(e.device_slot) : std::nullopt;
        const std::vector<uint32_t>* ids = held ? &held->token_ids
                                         : !e.pinned && e.block ? &e.block->identity().token_ids
                                                                : nullptr;
        if (!ids || (held && held->hash != keys[i].hash) ||
            !std::equal(keys[i].tokens.begin(), keys[i].tokens.end(), ids->begin(), ids->end())) {
          wrong.fetch_add(1);
        }
        unpinned.fetch_add(e.pinned ? 0 : 1, std::memory_order_relaxed);
      }
      fetched.fetch_add(got.size(), std::memory_order_relaxed);
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) threads.emplace_back(worker, i);
  std::this_thread::sleep_for(std::chrono::seconds(2));
  stop = true;
  for (auto& t : threads) t.join();

  EXPECT_GT(fetched.load(), 100u);
  EXPECT_EQ(wrong.load(), 0u) << "every handed-out block pinned at a slot holding its tokens, or on the host ("
                              << unpinned.load() << " of " << fetched.load() << ")";
  EXPECT_EQ(pool->blocks_in_use(), 0u) << "every pin released";
}

INSTANTIATE_TEST_SUITE_P(Policies, TieredCacheConcurrencyTest,
                         ::testing::Values("lru", "chain-lru", "s3fifo", "s3fifo-chain",
                                           "adaptive"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

}  // namespace
}  // namespace kvtier
