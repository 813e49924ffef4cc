// The SSD tier under a failing disk: EIO and short counts on real io_uring writes, syncs and reads,
// and ENOSPC where segments are allocated, injected through tiers/ssd/io/io_fault_seam.h (no mount
// needed). Whatever fails is counted and dropped; whatever was stored reads back exact or not at
// all.
#include <cerrno>
#include <filesystem>
#include <functional>
#include <thread>

#include <gtest/gtest.h>

#include "cache/tiered_cache.h"
#include "tests/support/io_fault_injector.h"
#include "tests/tiers/ssd/ssd_test_env.h"

namespace kvtier {
namespace {

using testing::IoFault;
using testing::IoFaultInjector;
using testing::request_for;
using testing::ScopedIoFault;
using testing::seeded_block;
using testing::small_ssd_options;

class SsdFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    layouts_ = std::make_shared<LayoutRegistry>();
    layout_ = *layouts_->add(KvLayout::uniform("faults", 2, 2, 64, 16, DType::kBF16));  // 16 KiB
    segments_ = std::filesystem::canonical(dir_.path()).string() + "/segments/";
  }
  void TearDown() override { IoFaultInjector::disarm(); }

  std::unique_ptr<SsdTier> open(SsdTierOptions o) {
    auto t = SsdTier::open(std::move(o), layouts_);
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    return t.ok() ? std::move(t).value() : nullptr;
  }
  std::unique_ptr<SsdTier> open() { return open(small_ssd_options(dir_.str())); }
  IoFault fault(IoSite site, int error, uint64_t skip = 0,
                uint64_t count = std::numeric_limits<uint64_t>::max()) const {
    return IoFault{site, segments_, error, skip, count};
  }
  std::vector<BlockRef> insert(SsdTier& tier, uint64_t first, uint64_t n) {
    std::vector<BlockRef> out;
    for (uint64_t s = first; s < first + n; ++s) {
      out.push_back(seeded_block(layout_, s));
      EXPECT_TRUE(tier.insert(out.back()).ok());
    }
    tier.flush();
    return out;
  }
  // Reads every block: each is its exact bytes or a miss, never anything else. Returns the misses.
  size_t misses(SsdTier& tier, const std::vector<BlockRef>& blocks) {
    std::vector<BlockRequest> requests;
    for (const auto& b : blocks) requests.push_back(request_for(b));
    auto got = tier.read_many(requests);
    size_t missed = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      if (!got[i].ok()) {
        EXPECT_EQ(got[i].status().code(), StatusCode::kNotFound) << got[i].status().to_string();
        ++missed;
        continue;
      }
      EXPECT_TRUE(testing::same_bytes(**got[i], *blocks[i])) << "block " << i << " served wrong bytes";
    }
    return missed;
  }
  uint64_t segment_of(SsdTier& tier, const BlockRef& b) {
    auto e = tier.state_for_testing().index->get(b->hash());
    EXPECT_TRUE(e.ok() && e->has_value());
    return e.ok() && e->has_value() ? (**e).segment : 0;
  }
  BlockRef move_through_a_reclaim(SsdTier& tier, const std::function<void(const BlockRef&)>& during);
  static void expect_every_spill_accounted_for(const SsdTierMetrics& m) {
    EXPECT_EQ(m.spill_written.value() + m.spill_failed_io.value() + m.spill_failed_no_space.value() +
                  m.spill_failed_index.value(),
              m.spill_enqueued.value());
  }

  testing::TempDir dir_;
  std::string segments_;
  std::shared_ptr<LayoutRegistry> layouts_;
  std::shared_ptr<const KvLayout> layout_;
};

TEST_F(SsdFaultTest, FailedWritesDropTheirBlocksCountedAndSealTheirSegment) {
  auto tier = open();
  auto before = insert(*tier, 0, 10);
  const uint64_t active = segment_of(*tier, before.back());
  std::vector<BlockRef> during;
  {
    ScopedIoFault eio(fault(IoSite::kWrite, EIO, /*skip=*/2, /*count=*/3));
    during = insert(*tier, 10, 20);
    EXPECT_EQ(IoFaultInjector::hits(), 3u);
  }
  const auto& m = tier->metrics();
  EXPECT_EQ(m.spill_failed_io.value(), 3u);
  EXPECT_EQ(m.spill_written.value(), 27u);
  EXPECT_GE(m.segments_sealed.value(), 1u);
  expect_every_spill_accounted_for(m);
  EXPECT_EQ(misses(*tier, before), 0u);
  EXPECT_EQ(misses(*tier, during), 3u);
  // The segment the failure hit takes nothing more.
  auto after = insert(*tier, 30, 5);
  for (const auto& b : after) EXPECT_NE(segment_of(*tier, b), active);
  EXPECT_EQ(misses(*tier, after), 0u);
  // And a restart finds exactly what was indexed.
  tier.reset();
  tier = open();
  EXPECT_EQ(misses(*tier, before), 0u);
  EXPECT_EQ(misses(*tier, during), 3u);
  EXPECT_EQ(misses(*tier, after), 0u);
  EXPECT_EQ(tier->metrics().corrupt_total(), 0u);
}

TEST_F(SsdFaultTest, AFailedSyncDropsWhatItCoveredAndSealsTheSegment) {
  auto tier = open();
  auto before = insert(*tier, 0, 4);
  const uint64_t active = segment_of(*tier, before.back());
  std::vector<BlockRef> during;
  {
    ScopedIoFault eio(fault(IoSite::kDataSync, EIO, 0, 1));
    during = insert(*tier, 4, 8);
    EXPECT_EQ(IoFaultInjector::hits(), 1u);
  }
  const auto& m = tier->metrics();
  EXPECT_GE(m.spill_failed_io.value(), 1u);
  EXPECT_EQ(m.segments_sealed.value(), 1u);
  expect_every_spill_accounted_for(m);
  EXPECT_EQ(misses(*tier, before), 0u);
  EXPECT_EQ(misses(*tier, during), m.spill_failed_io.value());
  auto after = insert(*tier, 12, 4);
  for (const auto& b : after) EXPECT_NE(segment_of(*tier, b), active);
  EXPECT_EQ(misses(*tier, after), 0u);
}

TEST_F(SsdFaultTest, ShortTransfersAreContinuedAndEveryByteArrives) {
  std::vector<BlockRef> blocks;
  {
    auto tier = open();
    ScopedIoFault short_writes(fault(IoSite::kWrite, 0));
    blocks = insert(*tier, 0, 20);
    EXPECT_GE(IoFaultInjector::hits(), 20u);
    EXPECT_EQ(tier->metrics().spill_written.value(), 20u);
    EXPECT_EQ(tier->metrics().spill_failed_io.value(), 0u);
  }
  for (const uint64_t coalesce : {uint64_t{0}, uint64_t{1} << 20}) {
    auto o = small_ssd_options(dir_.str());
    o.coalesce_read_bytes = coalesce;
    auto tier = open(o);
    ScopedIoFault short_reads(fault(IoSite::kRead, 0));
    EXPECT_EQ(misses(*tier, blocks), 0u) << "coalesce " << coalesce;
    EXPECT_GE(IoFaultInjector::hits(), 1u);
    EXPECT_EQ(tier->metrics().corrupt_total(), 0u);
  }
}

TEST_F(SsdFaultTest, AFailedReadIsAMissAndAQuarantineAndTheRestIsServed) {
  auto tier = open();
  auto blocks = insert(*tier, 0, 20);
  {
    ScopedIoFault eio(fault(IoSite::kRead, EIO, 5, 1));
    EXPECT_EQ(misses(*tier, blocks), 1u);
  }
  EXPECT_EQ(tier->metrics().corrupt_io.value(), 1u);
  size_t gone = 0;
  for (const auto& b : blocks) gone += !tier->contains(b->hash());
  EXPECT_EQ(gone, 1u) << "the record that failed to read is out of the index";
  EXPECT_EQ(misses(*tier, blocks), 1u);
}

TEST_F(SsdFaultTest, AFailedMergedReadIsRetriedRecordByRecord) {
  auto o = small_ssd_options(dir_.str());
  o.coalesce_read_bytes = 1 << 20;
  auto tier = open(o);
  auto blocks = insert(*tier, 0, 20);
  {
    ScopedIoFault eio(fault(IoSite::kRead, EIO, 0, 1));  // the first merged read
    EXPECT_EQ(misses(*tier, blocks), 0u);
    EXPECT_EQ(IoFaultInjector::hits(), 1u);
  }
  EXPECT_EQ(tier->metrics().corrupt_total(), 0u);
}

// ENOSPC where the writer allocates a segment, with no small file system to mount: the writer
// drops and counts, keeps what it stored, and writes again once space returns.
TEST_F(SsdFaultTest, NoSpaceForANewSegmentFailsCleanlyAndRecovers) {
  auto o = small_ssd_options(dir_.str());
  o.capacity_bytes = 64 << 20;  // the "disk" fills long before the tier's capacity
  auto tier = open(o);
  std::vector<BlockRef> blocks;
  {
    ScopedIoFault full(fault(IoSite::kAllocate, ENOSPC, /*skip=*/2));
    for (uint64_t s = 0; s < 200; s += 20) {
      auto more = insert(*tier, s, 20);
      blocks.insert(blocks.end(), more.begin(), more.end());
    }
    EXPECT_GE(IoFaultInjector::hits(), 1u);
  }
  const auto& m = tier->metrics();
  EXPECT_GT(m.spill_failed_no_space.value(), 0u);
  EXPECT_GT(m.spill_written.value(), 0u);
  EXPECT_EQ(m.spill_failed_io.value(), 0u);
  expect_every_spill_accounted_for(m);
  EXPECT_EQ(tier->state_for_testing().segments.count(), 2u);
  EXPECT_EQ(misses(*tier, blocks), m.spill_failed_no_space.value());
  EXPECT_EQ(m.corrupt_total(), 0u);
  // Space is back.
  auto later = insert(*tier, 1000, 20);
  EXPECT_EQ(misses(*tier, later), 0u);
  EXPECT_EQ(misses(*tier, blocks), m.spill_failed_no_space.value());
}

// A block read since it was written is moved out of its segment when that segment is reclaimed,
// and travels in a write group of its own behind the group whose rotation reclaimed it. Runs
// `during(hot)` while such a move is on its way: the hot block is in no index then, and the older
// group is held writing (a slow disk) so the window is certain. Returns the hot block, after the
// tier flushed.
BlockRef SsdFaultTest::move_through_a_reclaim(SsdTier& tier, const std::function<void(const BlockRef&)>& during) {
  SsdState& state = tier.state_for_testing();
  BlockRef hot = seeded_block(layout_, 1);
  EXPECT_TRUE(tier.insert(hot).ok());
  tier.flush();
  EXPECT_TRUE(tier.read(request_for(hot)).ok());  // read since written: the reclaim moves it
  const uint64_t first = segment_of(tier, hot);
  const uint64_t record_bytes = record_padded(state.index->get(hot->hash())->value().length);
  uint64_t seed = 10;
  while (state.segments.count() < 3) insert(tier, seed++, 1);
  const uint64_t third = state.segments.max_id();
  const uint64_t room = (tier.options().segment_size - state.segments.record(third)->watermark) / record_bytes;
  // The writes that still fit the third segment go through; the first ones after it (the group that
  // reclaims the first segment, then the moved block's) are held half a second each.
  ScopedIoFault slow(IoFault{IoSite::kWrite, segments_, 0, /*skip=*/room, /*count=*/3, std::chrono::milliseconds(500)});
  std::thread writer([&] {
    for (uint64_t s = 0; s < room + 8; ++s) EXPECT_TRUE(tier.insert(seeded_block(layout_, 1000 + s)).ok());
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (state.segments.record(first) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_FALSE(state.segments.record(first)) << "the first segment was reclaimed";
  EXPECT_FALSE(tier.contains(hot->hash())) << "a moved block is in no index until its group commits";
  during(hot);
  writer.join();
  tier.flush();
  EXPECT_GE(IoFaultInjector::hits(), 1u) << "the older group was still writing";
  return hot;
}

// The older group finishing first once made the tier forget the erase, and the moved copy was
// indexed again.
TEST_F(SsdFaultTest, ABlockErasedWhileItsSegmentsReclaimMovesItStaysErased) {
  auto o = small_ssd_options(dir_.str());
  o.capacity_bytes = 3 << 20;  // three segments: opening a fourth reclaims the first
  auto tier = open(o);
  BlockRef hot = move_through_a_reclaim(*tier, [&](const BlockRef& b) {
    EXPECT_EQ(*tier->erase_durably(b->hash()), false) << "in no index: nothing to remove";
  });
  EXPECT_FALSE(tier->contains(hot->hash())) << "an erased block came back with its move";
  EXPECT_EQ(tier->read(request_for(hot)).status().code(), StatusCode::kNotFound);
}

// A tenant's DELETE reads the block's namespace where it lies first. A block the SSD is moving
// can be read nowhere: it was once taken for another tenant's, left alone, answered "not cached",
// and indexed again by its move.
TEST_F(SsdFaultTest, ATenantsDeleteOfABlockTheSsdIsMovingErasesIt) {
  auto o = small_ssd_options(dir_.str());
  o.capacity_bytes = 3 << 20;
  std::shared_ptr<SsdTier> ssd = open(o);
  TieredCache cache({ssd});
  BlockRef hot = move_through_a_reclaim(*ssd, [&](const BlockRef& b) {
    auto erased = cache.erase_in(b->identity().namespace_id, b->hash());
    ASSERT_TRUE(erased.ok()) << erased.status().to_string();
    EXPECT_EQ(*erased, TieredCache::ScopedErase::kAbsent) << "answered as not cached";
    EXPECT_EQ(*cache.erase_in("another tenant", b->hash()), TieredCache::ScopedErase::kAbsent);
  });
  EXPECT_FALSE(ssd->contains(hot->hash())) << "the DELETE was undone by the move";
  BlockRef other = seeded_block(layout_, 2);
  ASSERT_TRUE(cache.insert(other).ok());
  ssd->flush();
  EXPECT_EQ(*cache.erase_in("another tenant", other->hash()), TieredCache::ScopedErase::kForeign);
  EXPECT_TRUE(ssd->contains(other->hash())) << "another tenant's block is left alone";
  EXPECT_EQ(*cache.erase_in(other->identity().namespace_id, other->hash()), TieredCache::ScopedErase::kErased);
}

TEST_F(SsdFaultTest, NoSpaceOnAWriteIsCountedAsNoSpace) {
  auto tier = open();
  std::vector<BlockRef> blocks;
  {
    ScopedIoFault full(fault(IoSite::kWrite, ENOSPC, 0, 2));
    blocks = insert(*tier, 0, 10);
  }
  EXPECT_EQ(tier->metrics().spill_failed_no_space.value(), 2u);
  EXPECT_EQ(tier->metrics().spill_failed_io.value(), 0u);
  expect_every_spill_accounted_for(tier->metrics());
  EXPECT_EQ(misses(*tier, blocks), 2u);
}

}  // namespace
}  // namespace kvtier
