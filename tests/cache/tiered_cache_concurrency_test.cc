// Eight threads looking up, publishing and fetching at once against two RAM tiers. Run under TSan
// (`make test SANITIZE=thread`); the invariants are checked while it runs and after.
#include <atomic>
#include <chrono>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "cache/tiered_cache.h"
#include "tests/cache/cache_test_blocks.h"
#include "tiers/ram_tier.h"

namespace kvtier {
namespace {

using testing::computed_block;

TEST(TieredCacheConcurrency, EightThreadsOfLookupInsertFetchKeepTheInvariants) {
  auto h = testing::small_hasher();
  const auto first = testing::prompt(4, 1);
  const uint64_t bb = computed_block(h, h.keys(first, {}), 0)->size_bytes();
  RamTierOptions o0, o1;
  o0.capacity_bytes = 40 * bb;
  o0.name = "ram0";
  o1.capacity_bytes = 150 * bb;
  o1.name = "ram1";
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
  EXPECT_EQ(top->lru_order().size(), top->block_count());
  // Byte accounting agrees with what is held.
  uint64_t sum = 0;
  for (const BlockHash& hh : top->lru_order()) sum += (*top->read({hh, {}})).get()->size_bytes();
  EXPECT_EQ(sum, top->used_bytes());
}

}  // namespace
}  // namespace kvtier
