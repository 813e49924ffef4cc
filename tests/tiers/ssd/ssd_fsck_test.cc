#include "tiers/ssd/ssd_fsck.h"

#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "tests/tiers/ssd/ssd_test_env.h"

namespace kvtier {
namespace {

TEST(SsdFsckTest, ReportsAHealthyDirectoryAsCleanThenFindsAndRepairsDamage) {
  testing::TempDir dir;
  auto layouts = std::make_shared<LayoutRegistry>();
  auto layout = *layouts->add(KvLayout::uniform("f", 2, 2, 64, 16, DType::kBF16));
  std::vector<BlockRef> blocks;
  IndexEntry victim;
  {
    auto tier = std::move(SsdTier::open(testing::small_ssd_options(dir.str()), layouts)).value();
    for (uint64_t s = 0; s < 12; ++s) {
      blocks.push_back(testing::seeded_block(layout, s));
      ASSERT_TRUE(tier->insert(blocks.back()).ok());
    }
    tier->flush();
    victim = **tier->state_for_testing().index->get(blocks[4]->hash());
  }

  auto clean = fsck_ssd_dir(dir.str(), {});
  ASSERT_TRUE(clean.ok()) << clean.status().to_string();
  EXPECT_TRUE(clean->clean());
  EXPECT_EQ(clean->entries, 12u);
  EXPECT_EQ(clean->ok, 12u);
  EXPECT_EQ(clean->orphaned_bytes, 0u);

  // Damage one record.
  const std::string seg = dir.str() + "/segments/" + SegmentFile::file_name(victim.segment);
  const int fd = ::open(seg.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  const char junk[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  ASSERT_EQ(::pwrite(fd, junk, sizeof(junk), static_cast<off_t>(victim.offset + 5000)), 8);
  ::close(fd);

  uint64_t progress_calls = 0;
  FsckOptions look;
  FsckProgress last;
  look.progress = [&](const FsckProgress& p) {
    ++progress_calls;
    EXPECT_GE(p.entries_done, last.entries_done) << "progress only moves forward";
    EXPECT_GE(p.bytes_done, last.bytes_done);
    EXPECT_LE(p.bytes_done, p.bytes_total);
    last = p;
  };
  auto found = fsck_ssd_dir(dir.str(), look);
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(found->corrupt, 1u);
  EXPECT_EQ(found->ok, 11u);
  EXPECT_GT(found->orphaned_bytes, 0u) << "the damaged record's bytes are no longer accounted for";
  EXPECT_GT(progress_calls, 0u);
  EXPECT_EQ(last.entries_done, last.entries_total) << "the last call says it is done";
  EXPECT_EQ(last.bytes_done, last.bytes_total);
  EXPECT_GT(last.bytes_total, 0u);
  ASSERT_FALSE(found->problems.empty());
  EXPECT_NE(found->problems[0].find(blocks[4]->hash().hex()), std::string::npos);
  auto again = fsck_ssd_dir(dir.str(), {});
  EXPECT_EQ(again->corrupt, 1u) << "without --repair nothing changes";

  FsckOptions repair;
  repair.repair = true;
  auto repaired = fsck_ssd_dir(dir.str(), repair);
  ASSERT_TRUE(repaired.ok());
  EXPECT_EQ(repaired->repaired, 1u);
  auto after = fsck_ssd_dir(dir.str(), {});
  EXPECT_TRUE(after->clean());
  EXPECT_EQ(after->entries, 11u);

  // And the repaired directory serves the survivors.
  auto tier = std::move(SsdTier::open(testing::small_ssd_options(dir.str()), layouts)).value();
  for (size_t i = 0; i < blocks.size(); ++i) {
    EXPECT_EQ(tier->read(testing::request_for(blocks[i])).ok(), i != 4) << i;
  }
}

TEST(SsdFsckTest, RefusesADirectoryInUse) {
  testing::TempDir dir;
  auto layouts = std::make_shared<LayoutRegistry>();
  auto tier = SsdTier::open(testing::small_ssd_options(dir.str()), layouts);
  ASSERT_TRUE(tier.ok());
  auto r = fsck_ssd_dir(dir.str(), {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace kvtier
