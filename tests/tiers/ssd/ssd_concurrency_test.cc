// Writers, readers and an eraser on one SSD tier at once, with reclaim going on underneath. Every
// block served must be exactly the block asked for. Run under TSan (`make test SANITIZE=thread`).
#include <atomic>
#include <chrono>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "tests/tiers/ssd/ssd_test_env.h"

namespace kvtier {
namespace {

TEST(SsdTierConcurrencyTest, WritersReadersAndAnEraserNeverSeeAWrongBlock) {
  testing::TempDir dir;
  auto layouts = std::make_shared<LayoutRegistry>();
  auto layout = *layouts->add(KvLayout::uniform("c", 2, 2, 64, 16, DType::kBF16));
  auto o = testing::small_ssd_options(dir.str());
  o.capacity_bytes = 4 << 20;  // small: reclaim runs while readers read
  auto tier = std::move(SsdTier::open(o, layouts)).value();

  constexpr uint64_t kSeeds = 400;
  std::vector<BlockRef> blocks;
  for (uint64_t s = 0; s < kSeeds; ++s) blocks.push_back(testing::seeded_block(layout, s));
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> served{0}, wrong{0}, ops{0};

  std::vector<std::thread> threads;
  for (int w = 0; w < 3; ++w) {
    threads.emplace_back([&, w] {
      std::mt19937 rng(w);
      while (!stop) {
        (void)tier->insert(blocks[rng() % kSeeds]);
        ops.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back([&, r] {
      std::mt19937 rng(100 + r);
      while (!stop) {
        std::vector<BlockRequest> reqs;
        std::vector<size_t> which;
        for (int k = 0; k < 8; ++k) {
          which.push_back(rng() % kSeeds);
          reqs.push_back(testing::request_for(blocks[which.back()]));
        }
        auto got = tier->read_many(reqs);
        for (size_t k = 0; k < got.size(); ++k) {
          if (!got[k].ok()) continue;
          served.fetch_add(1, std::memory_order_relaxed);
          if (!testing::same_bytes(**got[k], *blocks[which[k]])) wrong.fetch_add(1);
        }
        ops.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  threads.emplace_back([&] {
    std::mt19937 rng(999);
    while (!stop) {
      tier->erase(blocks[rng() % kSeeds]->hash());
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  std::this_thread::sleep_for(std::chrono::seconds(3));
  stop = true;
  for (auto& t : threads) t.join();
  tier->flush();

  EXPECT_GT(served.load(), 0u);
  EXPECT_EQ(wrong.load(), 0u);
  EXPECT_EQ(tier->metrics().corrupt_total(), 0u) << "races are misses, never corruption";
  EXPECT_LE(tier->used_bytes(), o.capacity_bytes);
  // The index and the segments' live counters agree.
  uint64_t indexed = 0;
  ASSERT_TRUE(tier->state_for_testing().index->scan_entries(
      [&](const BlockHash&, const Result<IndexEntry>&) { ++indexed; }).ok());
  EXPECT_EQ(indexed, tier->block_count());
}

}  // namespace
}  // namespace kvtier
