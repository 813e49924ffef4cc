// TieredCache::fetch_async against a real SSD tier slowed down (its reads held back 300 ms each):
// the caller keeps working while the prefix loads, evictions go on around the load, the fetched
// blocks stay pinned until released, and a handle dropped early gives its pins back.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
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
PrefixHasher hasher() { return testing::ssd_sized_hasher(); }
BlockRef computed_block(const PrefixHasher& h, const std::vector<BlockKey>& keys, size_t i) {
  return testing::ssd_sized_block(h, keys, i);
}

class FetchAsyncTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // RAM: the prefix's four blocks (as read back) and a little more.
    testing::RamOverSsd tiers(dir_.str(), 6 * (20 << 10));
    ASSERT_TRUE(tiers.ssd);
    ssd_ = tiers.ssd;
    ram_ = tiers.ram;
    cache_ = std::move(tiers.cache);
    tokens_ = prompt(64, 1);
    keys_ = h_.keys(tokens_, {});
    publish(keys_);
    publish_other(2);  // pushes the prefix's four blocks down to the SSD
    ssd_->flush();
    for (const auto& k : keys_) {
      ASSERT_FALSE(ram_->contains(k.hash));
      ASSERT_TRUE(ssd_->contains(k.hash));
    }
  }
  void TearDown() override { testing::IoFaultInjector::disarm(); }

  void publish(const std::vector<BlockKey>& keys) {
    for (size_t i = 0; i < keys.size(); ++i) ASSERT_TRUE(cache_->insert(computed_block(h_, keys, i)).ok());
  }
  // Eight blocks of another prompt (`seed`): more than RAM holds.
  void publish_other(uint32_t seed) {
    other_.push_back(prompt(128, seed));
    publish(h_.keys(other_.back(), {}));
  }
  testing::IoFault slow_reads() const {
    return {IoSite::kRead, std::filesystem::canonical(dir_.path()).string() + "/", 0, 0,
            std::numeric_limits<uint64_t>::max(), std::chrono::milliseconds(300)};
  }
  size_t prefix_in_ram() const {
    size_t n = 0;
    for (const auto& k : keys_) n += ram_->contains(k.hash);
    return n;
  }

  testing::TempDir dir_;
  PrefixHasher h_ = hasher();
  std::shared_ptr<SsdTier> ssd_;
  std::shared_ptr<RamTier> ram_;
  std::unique_ptr<TieredCache> cache_;
  std::vector<uint32_t> tokens_;
  std::vector<BlockKey> keys_;
  std::vector<std::vector<uint32_t>> other_;
};

TEST_F(FetchAsyncTest, ALoadFromSsdRunsInTheBackgroundAndKeepsItsPinsWhileOthersEvict) {
  testing::ScopedIoFault slow(slow_reads());
  const auto t0 = std::chrono::steady_clock::now();
  PendingFetch pending = cache_->fetch_async(keys_);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(250)) << "returned before the disk did";
  EXPECT_TRUE(pending.in_background());
  EXPECT_FALSE(pending.ready());
  // The caller's thread goes on working meanwhile, evicting from RAM as it publishes.
  publish_other(3);
  EXPECT_EQ(cache_->metrics().background_fetches_in_flight.value(), 1);

  PinnedBlocks got = pending.wait();
  ASSERT_EQ(got.size(), 4u);
  for (size_t i = 0; i < got.size(); ++i) {
    const auto& e = got.entries()[i];
    EXPECT_TRUE(e.pinned) << "block " << i;
    EXPECT_EQ(e.source_tier, 1);
    ASSERT_TRUE(e.block);
    EXPECT_TRUE(testing::same_bytes(*e.block, *computed_block(h_, keys_, i))) << "block " << i;
  }
  EXPECT_EQ(cache_->metrics().background_fetches.value(), 1u);
  EXPECT_EQ(cache_->metrics().background_fetches_in_flight.value(), 0);
  // Pinned, they outlast more pressure; released, they are evictable again.
  publish_other(4);
  EXPECT_EQ(prefix_in_ram(), 4u);
  got.release();
  publish_other(5);
  EXPECT_EQ(prefix_in_ram(), 0u);
}

TEST_F(FetchAsyncTest, AHandleDroppedBeforeTheLoadEndsGivesItsPinsBack) {
  {
    testing::ScopedIoFault slow(slow_reads());
    (void)cache_->fetch_async(keys_);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (cache_->metrics().background_fetches_in_flight.value() > 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_EQ(cache_->metrics().background_fetches_in_flight.value(), 0);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the job lets go of its result
  EXPECT_EQ(prefix_in_ram(), 4u) << "promoted by the load";
  publish_other(6);
  EXPECT_EQ(prefix_in_ram(), 0u) << "nothing left pinned";
}

TEST_F(FetchAsyncTest, AFetchOfBlocksInMemoryIsReadyAtOnce) {
  PinnedBlocks first = cache_->fetch(keys_);  // brings the prefix up to RAM
  first.release();
  PendingFetch again = cache_->fetch_async(keys_);
  EXPECT_FALSE(again.in_background());
  EXPECT_TRUE(again.ready());
  PinnedBlocks got = again.wait();
  ASSERT_EQ(got.size(), 4u);
  for (const auto& e : got.entries()) EXPECT_EQ(e.source_tier, 0);
  EXPECT_EQ(cache_->metrics().background_fetches.value(), 0u);
}

// A prefix of 40 blocks on the SSD is read and promoted in slices (16 blocks, then the rest), the
// next slice read while this one is promoted; a damaged record in the second slice ends the prefix
// right there, and every block before it is served exact.
TEST(FetchSlicesTest, ALongPrefixFromSsdIsServedExactlyUpToItsFirstDamagedBlock) {
  testing::TempDir dir;
  auto registry = std::make_shared<LayoutRegistry>();
  ASSERT_TRUE(registry->add(*layout()).ok());
  auto ssd = std::shared_ptr<SsdTier>(std::move(SsdTier::open(testing::small_ssd_options(dir.str()), registry)).value());
  RamTierOptions o;
  o.capacity_bytes = 100 * (20 << 10);
  o.eviction = "lru";  // keeps a lone block of the chain (chain-lru would demote it as an orphan)
  auto ram = std::make_shared<RamTier>(o);
  TieredCache cache({ram, ssd});
  PrefixHasher h = hasher();
  const auto tokens = prompt(40 * 16, 7);
  const auto keys = h.keys(tokens, {});
  for (size_t i = 0; i < keys.size(); ++i) ASSERT_TRUE(ssd->insert(computed_block(h, keys, i)).ok());
  ssd->flush();
  ASSERT_TRUE(ram->insert(computed_block(h, keys, 3)).ok());  // one block of the first slice in RAM
  auto check = [&](size_t expect) {
    PinnedBlocks got = cache.fetch(keys);
    ASSERT_EQ(got.size(), expect);
    for (size_t i = 0; i < got.size(); ++i) {
      const auto& e = got.entries()[i];
      EXPECT_EQ(e.source_tier, i == 3 ? 0 : 1) << "block " << i;
      EXPECT_TRUE(e.pinned) << "block " << i;
      EXPECT_TRUE(testing::same_bytes(*e.block, *computed_block(h, keys, i))) << "block " << i;
    }
  };
  check(40);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i != 3) ram->erase(keys[i].hash);
  }
  // Damage block 30's record on disk.
  auto e = ssd->state_for_testing().index->get(keys[30].hash);
  ASSERT_TRUE(e.ok() && e->has_value());
  const int fd = ::open(ssd->state_for_testing().segment_path((**e).segment).c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  uint8_t byte = 0;
  const off_t at = static_cast<off_t>((**e).offset + (**e).length / 2);
  ASSERT_EQ(::pread(fd, &byte, 1, at), 1);
  byte ^= 0x10;
  ASSERT_EQ(::pwrite(fd, &byte, 1, at), 1);
  ::close(fd);
  check(30);
  EXPECT_EQ(ssd->metrics().corrupt_total(), 1u) << "quarantined, never served";
}

}  // namespace
}  // namespace kvtier

