// An erase is final against every move in flight (tiers/erase_fence.h): a prefetch or promotion
// that read the block before the erase, an eviction that was carrying it down, a write-behind
// batch. Real RAM and SSD tiers, a real slow disk (reads held back by the fault seam) so the
// moves are caught mid-way deterministically, then many free-running rounds for the rest.
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <chrono>
#include <random>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "cache/tiered_cache.h"
#include "tests/cache/cache_test_blocks.h"
#include "tests/cache/ram_over_ssd.h"
#include "tests/support/io_fault_injector.h"
#include "tests/tiers/ssd/ssd_test_env.h"
#include "tiers/ram_tier.h"

namespace kvtier {
namespace {

using testing::prompt;

std::shared_ptr<const KvLayout> layout() { return testing::ssd_sized_layout(); }
BlockRef computed_block(const PrefixHasher& h, const std::vector<BlockKey>& keys, size_t i) {
  return testing::ssd_sized_block(h, keys, i);
}

// The real SSD tier, with a gate on insert: an eviction can be held between leaving RAM and
// reaching the disk, where a DELETE then finds the block in neither.
class GatedSsd final : public Tier {
 public:
  explicit GatedSsd(std::shared_ptr<SsdTier> inner) : inner_(std::move(inner)) {}
  void hold(const BlockHash& hash) {
    std::lock_guard lock(mu_);
    held_ = hash;
    arrived_ = released_ = false;
  }
  void wait_arrived() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return arrived_; });
  }
  void release() {
    std::lock_guard lock(mu_);
    released_ = true;
    cv_.notify_all();
  }
  std::string_view name() const override { return inner_->name(); }
  bool reads_wait_on_io() const override { return true; }
  Result<InsertOutcome> insert(BlockRef block) override {
    {
      std::unique_lock lock(mu_);
      if (held_ && *held_ == block->hash()) {
        arrived_ = true;
        cv_.notify_all();
        cv_.wait(lock, [&] { return released_; });
        held_.reset();
      }
    }
    return inner_->insert(std::move(block));
  }
  void set_erase_fence(std::shared_ptr<EraseFence> fence) override { inner_->set_erase_fence(std::move(fence)); }
  bool contains(const BlockHash& h) const override { return inner_->contains(h); }
  Result<BlockRef> read(const BlockRequest& r) override { return inner_->read(r); }
  bool erase(const BlockHash& h) override { return inner_->erase(h); }
  Result<bool> erase_durably(const BlockHash& h) override { return inner_->erase_durably(h); }
  bool pin(const BlockHash& h) override { return inner_->pin(h); }
  void unpin(const BlockHash& h) override { inner_->unpin(h); }
  uint64_t capacity_bytes() const override { return inner_->capacity_bytes(); }
  uint64_t used_bytes() const override { return inner_->used_bytes(); }
  size_t block_count() const override { return inner_->block_count(); }
  void visit_metrics(MetricVisitor& v) const override { inner_->visit_metrics(v); }

 private:
  std::shared_ptr<SsdTier> inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<BlockHash> held_;
  bool arrived_ = false, released_ = false;
};

class EraseRaceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::RamOverSsd tiers(dir_.str(), 8 * (20 << 10));
    ASSERT_TRUE(tiers.ssd);
    ssd_ = tiers.ssd;
    ram_ = tiers.ram;
    cache_ = std::move(tiers.cache);
  }
  void TearDown() override { testing::IoFaultInjector::disarm(); }

  // A prompt of `blocks` blocks written straight to the SSD (as after a restart: RAM holds none).
  std::vector<BlockKey> on_ssd_only(std::vector<uint32_t>& tokens, size_t blocks, uint32_t seed) {
    tokens = prompt(blocks * layout()->block_size, seed);
    std::vector<BlockKey> keys = h_.keys(tokens, {});
    for (size_t i = 0; i < keys.size(); ++i) EXPECT_TRUE(ssd_->insert(computed_block(h_, keys, i)).ok());
    ssd_->flush();
    return keys;
  }
  // Tiers holding `hash` once every write in flight has landed.
  std::vector<std::string> holders(const BlockHash& hash) {
    ssd_->flush();
    std::vector<std::string> out;
    if (ram_->contains(hash)) out.push_back("ram");
    if (ssd_->contains(hash)) out.push_back("ssd");
    return out;
  }

  testing::TempDir dir_;
  PrefixHasher h_ = testing::ssd_sized_hasher();
  std::shared_ptr<SsdTier> ssd_;
  std::shared_ptr<RamTier> ram_;
  std::unique_ptr<TieredCache> cache_;
};

TEST_F(EraseRaceTest, APrefetchThatReadTheBlocksBeforeTheirDeleteDoesNotBringThemBack) {
  std::vector<uint32_t> tokens;
  const std::vector<BlockKey> keys = on_ssd_only(tokens, 4, 1);
  // The prefetch's read is held on the disk while every block is deleted.
  testing::ScopedIoFault slow({.site = IoSite::kRead, .path_prefix = dir_.str(), .error = 0,
                               .delay = std::chrono::milliseconds(300)});
  PendingFetch prefetch = cache_->fetch_async(keys);
  ASSERT_TRUE(prefetch.in_background());
  while (testing::IoFaultInjector::hits() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  for (const BlockKey& k : keys) EXPECT_TRUE(*cache_->erase(k.hash));
  PinnedBlocks got = prefetch.wait();  // read before the delete: this caller may have them
  got.release();
  for (const BlockKey& k : keys) EXPECT_EQ(holders(k.hash), std::vector<std::string>{}) << k.hash.hex();
  EXPECT_EQ(cache_->lookup(keys).matched_tokens, 0u);
  EXPECT_EQ(cache_->erase_fence().refused.value(), keys.size());
  EXPECT_EQ(cache_->erase_fence().tombstones(), 0u) << "pruned once no move older than the deletes is in flight";
}

TEST_F(EraseRaceTest, ABlockPutAgainAfterItsDeleteIsServed) {
  std::vector<uint32_t> tokens;
  const std::vector<BlockKey> keys = on_ssd_only(tokens, 2, 2);
  testing::ScopedIoFault slow({.site = IoSite::kRead, .path_prefix = dir_.str(), .error = 0,
                               .delay = std::chrono::milliseconds(200)});
  PendingFetch prefetch = cache_->fetch_async(keys);
  while (testing::IoFaultInjector::hits() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_TRUE(*cache_->erase(keys[0].hash));
  // The client writes it again while the old prefetch is still in flight: a fresh write wins.
  ASSERT_TRUE(cache_->insert(computed_block(h_, keys, 0)).ok());
  prefetch.wait().release();
  EXPECT_TRUE(ram_->contains(keys[0].hash));
}

TEST_F(EraseRaceTest, ManyPrefetchersAndADeleterLeaveNothingDeletedBehind) {
  // Free-running: three threads prefetch a prompt over and over while it is deleted block by
  // block, as in the hostile check that found the fault (1-6 of 48 blocks came back then).
  size_t resurrected = 0, rounds = 0;
  for (uint32_t round = 0; round < 12; ++round, ++rounds) {
    std::vector<uint32_t> tokens;
    const std::vector<BlockKey> keys = on_ssd_only(tokens, 12, 100 + round);
    std::atomic<bool> stop{false};
    std::vector<std::thread> prefetchers;
    for (int p = 0; p < 3; ++p) {
      prefetchers.emplace_back([&] {
        while (!stop.load()) cache_->fetch_async(keys).wait().release();
      });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    for (const BlockKey& k : keys) (void)cache_->erase(k.hash);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    stop = true;
    for (auto& t : prefetchers) t.join();
    for (const BlockKey& k : keys) resurrected += holders(k.hash).empty() ? 0 : 1;
  }
  EXPECT_EQ(resurrected, 0u) << "deleted blocks held again after " << rounds << " rounds";
  EXPECT_EQ(cache_->erase_fence().moves_in_flight(), 0u);
}

TEST_F(EraseRaceTest, ABlockDeletedBetweenLeavingRamAndReachingTheSsdStaysDeleted) {
  auto gated = std::make_shared<GatedSsd>(ssd_);
  cache_.reset();
  cache_ = std::make_unique<TieredCache>(std::vector<std::shared_ptr<Tier>>{ram_, gated});
  const std::vector<uint32_t> tokens = prompt(12 * layout()->block_size, 8);
  const std::vector<BlockKey> keys = h_.keys(tokens, {});
  ASSERT_TRUE(cache_->insert(computed_block(h_, keys, 0)).ok());
  gated->hold(keys[0].hash);
  std::thread publisher([&] {  // RAM fills; block 0, the oldest, is evicted and held on its way
    for (size_t i = 1; i < keys.size(); ++i) ASSERT_TRUE(cache_->insert(computed_block(h_, keys, i)).ok());
  });
  gated->wait_arrived();
  EXPECT_TRUE(*cache_->erase(keys[0].hash)) << "RAM still answers for a block on its way down";
  gated->release();
  publisher.join();
  EXPECT_EQ(holders(keys[0].hash), std::vector<std::string>{});
  EXPECT_EQ(cache_->erase_fence().refused.value(), 1u) << "the SSD refused it, under its own lock";
  for (size_t i = 1; i < keys.size(); ++i) EXPECT_FALSE(holders(keys[i].hash).empty()) << i;
}

TEST_F(EraseRaceTest, AnEvictionCarryingABlockDownDoesNotBringItBackAfterItsDelete) {
  // One thread publishes new blocks (each pushes RAM's oldest down to the SSD); another deletes
  // blocks about to be evicted, in RAM or on their way down. Free-running, the window rarely
  // opens (the gated test above opens it every time); this one is the eviction path's race check
  // under TSan (`make test SANITIZE=thread`).
  const std::vector<uint32_t> tokens = prompt(2000 * layout()->block_size, 7);
  const std::vector<BlockKey> keys = h_.keys(tokens, {});
  std::atomic<size_t> published{0};
  std::thread publisher([&] {
    for (size_t i = 0; i < keys.size(); ++i) {
      (void)cache_->insert(computed_block(h_, keys, i));
      published.store(i + 1);
    }
  });
  std::set<size_t> deleted;
  std::mt19937 rng(3);
  while (published.load() < keys.size()) {
    const size_t n = published.load();
    if (n < 8) continue;
    // RAM holds five blocks: those published four to seven ago are being evicted about now.
    const size_t i = n - 4 - rng() % 4;
    if (i % 3 != 0) continue;  // the rest fill RAM and push these down
    if (deleted.insert(i).second) (void)cache_->erase(keys[i].hash);
  }
  publisher.join();
  size_t resurrected = 0;
  for (size_t i : deleted) resurrected += holders(keys[i].hash).empty() ? 0 : 1;
  EXPECT_GT(deleted.size(), 20u);
  EXPECT_GT(ssd_->metrics().spill_enqueued.value(), 500u) << "the evictions went down to the SSD";
  EXPECT_EQ(resurrected, 0u) << "of " << deleted.size() << " deleted";
}

}  // namespace
}  // namespace kvtier
