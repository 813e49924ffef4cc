// The SSD tier over several directories (one per drive): blocks spread over all of them, every
// block found again after a restart whatever the order or number of directories, and a lost
// directory (deleted, unreadable, failing reads) costs only its own blocks.
#include "tiers/ssd/striped_ssd_tier.h"

#include <cerrno>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "base/metrics/metrics_exporters.h"
#include "tests/support/io_fault_injector.h"
#include "tests/tiers/ssd/ssd_test_env.h"

namespace kvtier {
namespace {

using testing::request_for;
using testing::seeded_block;
using testing::small_ssd_options;

class StripedSsdTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    layouts_ = std::make_shared<LayoutRegistry>();
    layout_ = *layouts_->add(KvLayout::uniform("striped", 2, 2, 64, 16, DType::kBF16));
    for (uint64_t s = 0; s < 60; ++s) blocks_.push_back(seeded_block(layout_, s));
  }
  void TearDown() override { testing::IoFaultInjector::disarm(); }

  SsdTierOptions options(std::vector<std::string> dirs) const {
    auto o = small_ssd_options(dirs.front());
    o.dirs = std::move(dirs);
    o.capacity_bytes = 32 << 20;
    return o;
  }
  std::vector<std::string> both() const { return {a_.str(), b_.str()}; }
  std::unique_ptr<StripedSsdTier> open(std::vector<std::string> dirs) {
    auto t = StripedSsdTier::open(options(std::move(dirs)), layouts_);
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    return t.ok() ? std::move(t).value() : nullptr;
  }
  void fill(StripedSsdTier& tier) {
    for (const auto& b : blocks_) ASSERT_EQ(*tier.insert(b), InsertOutcome::kInserted);
    tier.flush();
  }
  // Which of blocks_ each directory's index holds, by position in `tier.directories()`.
  std::vector<std::vector<size_t>> where(StripedSsdTier& tier) {
    std::vector<std::vector<size_t>> out(tier.directories().size());
    for (size_t d = 0; d < out.size(); ++d) {
      for (size_t i = 0; i < blocks_.size(); ++i) {
        if (tier.directories()[d]->contains(blocks_[i]->hash())) out[d].push_back(i);
      }
    }
    return out;
  }
  // Reads every block in one call: each exact or a miss. Returns which were served.
  std::vector<bool> served(StripedSsdTier& tier) {
    std::vector<BlockRequest> requests;
    for (const auto& b : blocks_) requests.push_back(request_for(b));
    auto got = tier.read_many(requests);
    std::vector<bool> ok(got.size());
    for (size_t i = 0; i < got.size(); ++i) {
      if (!got[i].ok()) {
        EXPECT_EQ(got[i].status().code(), StatusCode::kNotFound);
        continue;
      }
      EXPECT_TRUE(testing::same_bytes(**got[i], *blocks_[i])) << "block " << i;
      ok[i] = true;
    }
    return ok;
  }
  static size_t count(const std::vector<bool>& v) { return static_cast<size_t>(std::count(v.begin(), v.end(), true)); }

  testing::TempDir a_, b_, c_;
  std::shared_ptr<LayoutRegistry> layouts_;
  std::shared_ptr<const KvLayout> layout_;
  std::vector<BlockRef> blocks_;
};

TEST_F(StripedSsdTierTest, BlocksSpreadOverEveryDirectoryAndEveryOneIsFoundAfterRestart) {
  {
    auto tier = open(both());
    fill(*tier);
    auto w = where(*tier);
    ASSERT_EQ(w.size(), 2u);
    EXPECT_GE(w[0].size(), 15u) << "60 blocks placed by hash over two directories";
    EXPECT_GE(w[1].size(), 15u);
    EXPECT_EQ(w[0].size() + w[1].size(), 60u);
    EXPECT_EQ(tier->total(&SsdTierMetrics::spill_written), 60u);
    EXPECT_EQ(tier->capacity_bytes(), 32u << 20);
    EXPECT_EQ(count(served(*tier)), 60u);
  }
  // Another order, then a third directory: every block is still found, nothing is written twice.
  for (auto dirs : {std::vector<std::string>{b_.str(), a_.str()},
                    std::vector<std::string>{a_.str(), b_.str(), c_.str()}}) {
    auto tier = open(dirs);
    EXPECT_EQ(count(served(*tier)), 60u);
    // Asked together (the batched lookup) as asked one by one: with a third directory most
    // blocks' home is not where they lie, and absent hashes are absent everywhere.
    std::vector<BlockHash> hashes;
    for (const auto& b : blocks_) hashes.push_back(b->hash());
    for (uint64_t s = 1000; s < 1010; ++s) hashes.push_back(seeded_block(layout_, s)->hash());
    const std::vector<bool> many = tier->contains_many(hashes);
    ASSERT_EQ(many.size(), hashes.size());
    for (size_t i = 0; i < hashes.size(); ++i) {
      EXPECT_EQ(many[i], i < blocks_.size()) << "hash " << i;
      EXPECT_EQ(many[i], tier->contains(hashes[i])) << "hash " << i;
    }
    for (const auto& b : blocks_) EXPECT_EQ(*tier->insert(b), InsertOutcome::kAlreadyPresent);
    tier->flush();
    EXPECT_EQ(tier->total(&SsdTierMetrics::spill_written), 0u);
    EXPECT_EQ(tier->lost_directories(), 0u);
  }
}

TEST_F(StripedSsdTierTest, ADeletedDirectoryLosesOnlyItsBlocksCountedAndTheRestIsServed) {
  std::vector<std::vector<size_t>> w;
  {
    auto tier = open(both());
    fill(*tier);
    w = where(*tier);
  }
  std::filesystem::remove_all(b_.path());
  auto tier = open(both());
  EXPECT_EQ(tier->lost_directories(), 1u);
  const auto ok = served(*tier);
  for (size_t i : w[0]) EXPECT_TRUE(ok[i]) << "block " << i << " of the surviving directory";
  for (size_t i : w[1]) EXPECT_FALSE(ok[i]) << "block " << i << " of the lost directory";
  PrometheusTextWriter text;
  tier->visit_metrics(text);
  EXPECT_NE(text.text().find("kvtier_ssd_directories_lost_total 1"), std::string::npos) << text.text();
  // The emptied directory takes its blocks again.
  for (const auto& b : blocks_) ASSERT_TRUE(tier->insert(b).ok());
  tier->flush();
  EXPECT_EQ(count(served(*tier)), 60u);
  EXPECT_GT(tier->directories()[1]->metrics().spill_written.value(), 0u);
}

TEST_F(StripedSsdTierTest, AnUnreadableDirectoryIsLeftOutAndTheRestIsServed) {
  std::vector<std::vector<size_t>> w;
  {
    auto tier = open(both());
    fill(*tier);
    w = where(*tier);
  }
  std::ofstream(b_.str() + "/MANIFEST.json", std::ios::trunc) << "\x01 not json";
  auto tier = open(both());
  ASSERT_EQ(tier->directories().size(), 1u);
  EXPECT_EQ(tier->lost_directories(), 1u);
  const auto ok = served(*tier);
  for (size_t i : w[0]) EXPECT_TRUE(ok[i]);
  for (size_t i : w[1]) EXPECT_FALSE(ok[i]);
  PrometheusTextWriter text;
  tier->visit_metrics(text);
  EXPECT_NE(text.text().find("kvtier_ssd_directory_up{dir=\"" + b_.str() + "\"} 0"), std::string::npos)
      << text.text();
  // New blocks all go to the directory that is up.
  std::vector<BlockRef> more;
  for (uint64_t s = 100; s < 120; ++s) {
    more.push_back(seeded_block(layout_, s));
    ASSERT_TRUE(tier->insert(more.back()).ok());
  }
  tier->flush();
  for (const auto& b : more) EXPECT_TRUE(tier->read(request_for(b)).ok());
}

TEST_F(StripedSsdTierTest, ADirectoryWhoseReadsFailLosesOnlyItsBlocks) {
  auto tier = open(both());
  fill(*tier);
  auto w = where(*tier);
  testing::ScopedIoFault eio(testing::IoFault{
      IoSite::kRead, std::filesystem::canonical(b_.path()).string() + "/", EIO});
  const auto ok = served(*tier);
  for (size_t i : w[0]) EXPECT_TRUE(ok[i]);
  for (size_t i : w[1]) EXPECT_FALSE(ok[i]);
  EXPECT_EQ(tier->total(&SsdTierMetrics::corrupt_io), w[1].size());
}

TEST_F(StripedSsdTierTest, ConfigurationErrorsStopTheStart) {
  auto twice = StripedSsdTier::open(options({a_.str(), a_.str() + "/."}), layouts_);
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("given twice"), std::string::npos);

  auto o = options(both());
  o.capacity_bytes = 3 << 20;  // 1.5 segments per directory
  auto small = StripedSsdTier::open(o, layouts_);
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("per directory"), std::string::npos);

  auto holder = open({b_.str()});  // another process's cache: not a lost drive
  auto locked = StripedSsdTier::open(options(both()), layouts_);
  ASSERT_FALSE(locked.ok());
  EXPECT_NE(locked.status().message().find("in use"), std::string::npos) << locked.status().to_string();
}

TEST_F(StripedSsdTierTest, ANamespaceQuotaCountsAcrossDirectories) {
  auto o = options(both());
  const uint64_t record = 20 << 10;  // 16 KiB of data, its header, 4 KiB padding
  o.namespace_quotas["test"] = 10 * record;
  auto t = StripedSsdTier::open(o, layouts_);
  ASSERT_TRUE(t.ok());
  size_t accepted = 0;
  for (const auto& b : blocks_) accepted += (*t)->insert(b).ok();
  (*t)->flush();
  EXPECT_EQ(accepted, 10u) << "the quota is the namespace's over both directories";
  EXPECT_EQ((*t)->total(&SsdTierMetrics::spill_dropped_quota), 50u);
}

TEST_F(StripedSsdTierTest, MetricsAreOneSeriesEachSummedOverTheDirectories) {
  auto tier = open(both());
  fill(*tier);
  PrometheusTextWriter text;
  tier->visit_metrics(text);
  const std::string t = text.text();
  EXPECT_NE(t.find("\nkvtier_spill_written_total 60\n"), std::string::npos) << t;
  const auto first = t.find("kvtier_spill_written_total 60");
  EXPECT_EQ(t.find("kvtier_spill_written_total", first + 1), std::string::npos) << "one series";
  EXPECT_NE(t.find("kvtier_ssd_capacity_bytes 33554432"), std::string::npos) << t;
}

}  // namespace
}  // namespace kvtier
