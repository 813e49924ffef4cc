#include "tiers/ssd/ssd_tier.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include <gtest/gtest.h>

#include "base/metrics/metrics_exporters.h"
#include "tests/tiers/ssd/ssd_tier_fixture.h"

namespace kvtier {
namespace {

using testing::request_for;
using testing::SsdTierTest;
using testing::seeded_block;
using testing::small_ssd_options;
using testing::Values;


TEST_F(SsdTierTest, EveryDtypeRoundTripsBitExactThroughSpillRestartAndRead) {
  std::vector<BlockRef> blocks;
  for (size_t d = 0; d < by_dtype_.size(); ++d) {
    for (uint64_t s = 0; s < 5; ++s) {
      blocks.push_back(seeded_block(by_dtype_[d], 100 * d + s, testing::Values::kWithSpecials));
    }
  }
  {
    auto tier = open();
    for (const auto& b : blocks) ASSERT_EQ(*tier->insert(b), InsertOutcome::kInserted);
    tier->flush();
    EXPECT_EQ(tier->metrics().spill_written.value(), blocks.size());
    EXPECT_EQ(tier->close(), 0u);
  }
  auto tier = open();  // a new process would see the same
  for (const auto& b : blocks) {
    auto got = tier->read(request_for(b));
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_TRUE(testing::same_bytes(**got, *b));
    EXPECT_EQ((*got)->identity(), b->identity());
  }
  EXPECT_EQ(tier->metrics().corrupt_total(), 0u);
}

TEST_F(SsdTierTest, BlocksStillQueuedAreServedAndEverythingReadsBackWhileWriting) {
  auto tier = open();
  std::vector<BlockRef> blocks;
  for (uint64_t s = 0; s < 60; ++s) blocks.push_back(seeded_block(by_dtype_[2], s));
  for (const auto& b : blocks) {
    ASSERT_TRUE(tier->insert(b).ok());
    auto got = tier->read(request_for(b));  // queued or already written: either way, exact
    ASSERT_TRUE(got.ok());
    EXPECT_TRUE(testing::same_bytes(**got, *b));
  }
  tier->flush();
  for (const auto& b : blocks) EXPECT_TRUE(tier->read(request_for(b)).ok());
}

TEST_F(SsdTierTest, AQuantizedRamBlockLandsDequantizedWithItsOrigin) {
  auto layout = by_dtype_[2];
  BlockRef dense = seeded_block(layout, 7, testing::Values::kKvLike);
  auto quant = std::make_shared<const Block>(std::move(dense->quantized({4, 64})).value());
  auto tier = open();
  ASSERT_TRUE(tier->insert(quant).ok());
  tier->flush();
  tier->close();
  tier = open();
  auto got = tier->read(request_for(quant));
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE((*got)->any_quantized());
  EXPECT_TRUE(testing::same_bytes(**got, quant->dequantized()));
  for (int l = 0; l < layout->num_layers; ++l) {
    ASSERT_TRUE((*got)->dequantized_from(l).has_value());
    EXPECT_EQ(*(*got)->dequantized_from(l), (Quantization{4, 64}));
  }
}

TEST_F(SsdTierTest, FlippedBytesInASegmentAreQuarantinedNotServed) {
  auto tier = open();
  BlockRef a = seeded_block(by_dtype_[2], 1), b = seeded_block(by_dtype_[2], 2);
  ASSERT_TRUE(tier->insert(a).ok());
  ASSERT_TRUE(tier->insert(b).ok());
  tier->flush();
  const IndexEntry e = entry_of(*tier, a);
  flip_byte_inside(*tier, e, 0x40);
  auto got = tier->read(request_for(a));
  EXPECT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(tier->metrics().corrupt_checksum.value(), 1u);
  EXPECT_FALSE(tier->contains(a->hash())) << "quarantined: the entry is gone";
  EXPECT_TRUE(tier->read(request_for(b)).ok()) << "its neighbour is untouched";
}

TEST_F(SsdTierTest, ATruncatedSegmentDropsTheEntriesPastItsEndOnRestart) {
  std::vector<BlockRef> blocks;
  uint64_t segment = 0, cut = 0;
  {
    auto tier = open();
    for (uint64_t s = 0; s < 10; ++s) {
      blocks.push_back(seeded_block(by_dtype_[2], s));
      ASSERT_TRUE(tier->insert(blocks.back()).ok());
    }
    tier->flush();
    const IndexEntry mid = entry_of(*tier, blocks[5]);
    segment = mid.segment;
    cut = mid.offset + 4096;  // through the middle of block 5's record
    for (const auto& b : blocks) ASSERT_EQ(entry_of(*tier, b).segment, segment);
    tier->close();
  }
  ASSERT_EQ(::truncate((dir_.str() + "/segments/" + SegmentFile::file_name(segment)).c_str(),
                       static_cast<off_t>(cut)), 0);
  auto tier = open();
  EXPECT_EQ(tier->metrics().recovery_dropped_entries.value(), 5u);
  for (size_t i = 0; i < blocks.size(); ++i) {
    auto got = tier->read(request_for(blocks[i]));
    EXPECT_EQ(got.ok(), i < 5) << i;
    if (got.ok()) {
      EXPECT_TRUE(testing::same_bytes(**got, *blocks[i]));
    }
  }
  EXPECT_EQ(tier->metrics().corrupt_total(), 0u) << "dropped at open, never read";
}

TEST_F(SsdTierTest, ADeletedSegmentDropsItsEntriesOnRestart) {
  BlockRef a = seeded_block(by_dtype_[1], 3);
  uint64_t segment = 0;
  {
    auto tier = open();
    ASSERT_TRUE(tier->insert(a).ok());
    tier->flush();
    segment = entry_of(*tier, a).segment;
    tier->close();
  }
  std::filesystem::remove(dir_.str() + "/segments/" + SegmentFile::file_name(segment));
  auto tier = open();
  EXPECT_EQ(tier->metrics().recovery_dropped_entries.value(), 1u);
  EXPECT_FALSE(tier->contains(a->hash()));
  EXPECT_FALSE(tier->read(request_for(a)).ok());
  // And the tier keeps working.
  BlockRef b = seeded_block(by_dtype_[1], 4);
  ASSERT_TRUE(tier->insert(b).ok());
  tier->flush();
  EXPECT_TRUE(tier->read(request_for(b)).ok());
}

TEST_F(SsdTierTest, ADamagedIndexValueIsQuarantinedAndCounted) {
  auto tier = open();
  BlockRef a = seeded_block(by_dtype_[0], 5);
  ASSERT_TRUE(tier->insert(a).ok());
  tier->flush();
  std::string value = encode_index_entry(entry_of(*tier, a));
  value[10] ^= 1;  // inside the offset field
  ASSERT_TRUE(tier->state_for_testing().index->put_raw_value(a->hash(), value).ok());
  EXPECT_FALSE(tier->read(request_for(a)).ok());
  EXPECT_EQ(tier->metrics().corrupt_index_value.value(), 1u);
  EXPECT_FALSE(tier->contains(a->hash()));
}

// contains_many (a prefix lookup's one MultiGet) answers as contains() does for each hash: blocks
// on disk and still queued are held, absent ones are not, and an index value that cannot be
// decoded counts as held until a read quarantines it.
TEST_F(SsdTierTest, ContainsManyAnswersAsContainsDoesForEachHash) {
  auto tier = open();
  std::vector<BlockRef> on_disk, absent;
  for (uint64_t s = 0; s < 20; ++s) on_disk.push_back(seeded_block(by_dtype_[2], s));
  for (uint64_t s = 100; s < 105; ++s) absent.push_back(seeded_block(by_dtype_[2], s));
  for (const auto& b : on_disk) ASSERT_TRUE(tier->insert(b).ok());
  tier->flush();
  BlockRef damaged = seeded_block(by_dtype_[2], 50);
  ASSERT_TRUE(tier->state_for_testing().index->put_raw_value(damaged->hash(), "x").ok());
  BlockRef queued = seeded_block(by_dtype_[2], 60);
  ASSERT_TRUE(tier->insert(queued).ok());  // queued or written by now: held either way

  std::vector<BlockHash> hashes;
  std::vector<bool> expected;
  for (size_t i = 0; i < on_disk.size(); ++i) {
    hashes.push_back(on_disk[i]->hash());
    expected.push_back(true);
    if (i % 4 == 0) {  // absent ones interleaved, so positions matter
      hashes.push_back(absent[i / 4]->hash());
      expected.push_back(false);
    }
  }
  hashes.push_back(damaged->hash());
  expected.push_back(true);
  hashes.push_back(queued->hash());
  expected.push_back(true);
  const std::vector<bool> many = tier->contains_many(hashes);
  ASSERT_EQ(many.size(), hashes.size());
  for (size_t i = 0; i < hashes.size(); ++i) {
    EXPECT_EQ(many[i], expected[i]) << "hash " << i;
    EXPECT_EQ(many[i], tier->contains(hashes[i])) << "hash " << i;
  }
  EXPECT_TRUE(tier->contains_many({}).empty());
  tier->close();
  EXPECT_EQ(tier->contains_many(hashes), std::vector<bool>(hashes.size(), false));  // closed: holds nothing
}

TEST_F(SsdTierTest, AnEntryNamingAnotherRecordIsCaughtByItsChecksum) {
  auto tier = open();
  BlockRef a = seeded_block(by_dtype_[2], 1), b = seeded_block(by_dtype_[2], 2);
  ASSERT_TRUE(tier->insert(a).ok());
  ASSERT_TRUE(tier->insert(b).ok());
  tier->flush();
  IndexEntry misdirected = entry_of(*tier, a);
  const IndexEntry eb = entry_of(*tier, b);
  misdirected.offset = eb.offset;  // a's entry now names b's record: well formed, but wrong
  ASSERT_TRUE(tier->state_for_testing().index->put_raw_value(a->hash(), encode_index_entry(misdirected)).ok());
  EXPECT_FALSE(tier->read(request_for(a)).ok());
  EXPECT_EQ(tier->metrics().corrupt_checksum.value(), 1u);
  EXPECT_TRUE(tier->read(request_for(b)).ok());
}

TEST_F(SsdTierTest, ARequestWithOtherTokensIsNeverServed) {
  auto tier = open();
  BlockRef a = seeded_block(by_dtype_[2], 9);
  ASSERT_TRUE(tier->insert(a).ok());
  tier->flush();
  std::vector<uint32_t> other = a->identity().token_ids;
  other[3] += 1;
  EXPECT_FALSE(tier->read({a->hash(), other}).ok());
  EXPECT_EQ(tier->metrics().corrupt_identity.value(), 1u);
}

TEST_F(SsdTierTest, AFullSpillQueueDropsAndCountsWithoutBlocking) {
  auto o = small_ssd_options(dir_.str());
  o.spill_queue_bytes = 64 << 10;  // about three blocks
  auto tier = open(o);
  size_t accepted = 0, refused = 0;
  for (uint64_t s = 0; s < 200; ++s) {
    auto r = tier->insert(seeded_block(by_dtype_[0], s));
    if (r.ok()) {
      ++accepted;
    } else {
      EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
      ++refused;
    }
  }
  tier->flush();
  EXPECT_GT(refused, 0u);
  EXPECT_EQ(tier->metrics().spill_dropped_queue_full.value(), refused);
  EXPECT_EQ(tier->metrics().spill_written.value(), accepted);
}

// Two active segments: write groups take turns between them, each group's blocks stay together,
// reclaim leaves both alone, and everything indexed reads back exact, before and after a restart.
TEST_F(SsdTierTest, TwoActiveSegmentsTakeTurnsAndEverythingReadsBack) {
  auto o = small_ssd_options(dir_.str());
  o.active_segments = 2;
  o.capacity_bytes = 6 << 20;
  std::vector<BlockRef> blocks;
  std::map<uint64_t, size_t> per_segment;  // of the first groups
  {
    auto tier = open(o);
    for (uint64_t s = 0; s < 500; ++s) {  // ~10 MiB of records through 6 MiB
      blocks.push_back(seeded_block(by_dtype_[2], s));
      ASSERT_TRUE(tier->insert(blocks.back()).ok());
      if (s % 10 == 9) tier->flush();  // one group per ten blocks
      if (s == 39) {
        for (size_t i = 0; i < 40; ++i) per_segment[entry_of(*tier, blocks[i]).segment]++;
      }
    }
    tier->flush();
    EXPECT_GE(per_segment.size(), 2u) << "groups went to two segments";
    EXPECT_GT(tier->metrics().segments_reclaimed.value(), 0u);
    EXPECT_EQ(tier->metrics().spill_written.value(), 500u);
  }
  auto tier = open(o);
  const size_t served = served_exact(*tier, blocks);
  EXPECT_GE(served, 150u) << "what the last segments hold";
  EXPECT_LT(served, 500u) << "the oldest were reclaimed";
  EXPECT_EQ(tier->metrics().corrupt_total(), 0u);
}

// A namespace's SSD quota: its spills past it are refused and counted, other namespaces are not
// bound by it, an erase makes room, and the count is rebuilt from the index at open, so a restart
// does not reset it.
TEST_F(SsdTierTest, ANamespacePastItsSsdQuotaIsRefusedAndItsCountSurvivesRestart) {
  auto block = [&](uint64_t seed, const char* ns) { return seeded_block(by_dtype_[2], seed, Values::kRandom, ns); };
  uint64_t record = 0;  // the bytes one such block takes on disk
  {
    testing::TempDir scratch;
    auto t = open(small_ssd_options(scratch.str()));
    ASSERT_TRUE(t->insert(block(0, "a")).ok());
    t->flush();
    record = (entry_of(*t, block(0, "a")).length + kRecordAlign - 1) / kRecordAlign * kRecordAlign;
  }
  auto o = small_ssd_options(dir_.str());
  o.namespace_quotas = {{"a", 3 * record}};
  auto tier = open(o);
  for (uint64_t s = 0; s < 3; ++s) ASSERT_TRUE(tier->insert(block(s, "a")).ok());
  const auto refused = tier->insert(block(3, "a"));
  EXPECT_EQ(refused.status().code(), StatusCode::kNoSpace);
  EXPECT_NE(refused.status().message().find("quota"), std::string::npos) << refused.status().to_string();
  for (uint64_t s = 0; s < 5; ++s) EXPECT_TRUE(tier->insert(block(s, "b")).ok()) << "b has no quota";
  tier->flush();
  NamespaceUsage& usage = *tier->state_for_testing().namespaces;
  EXPECT_EQ(usage.held("a"), 3 * record);
  EXPECT_EQ(usage.refusals(), 1u);
  EXPECT_EQ(tier->metrics().spill_dropped_quota.value(), 1u);
  EXPECT_FALSE(tier->contains(block(3, "a")->hash())) << "nothing of the refused block";
  for (uint64_t s = 0; s < 3; ++s) EXPECT_TRUE(tier->read(request_for(block(s, "a"))).ok());

  ASSERT_TRUE(tier->erase(block(1, "a")->hash()));
  EXPECT_EQ(usage.held("a"), 2 * record);
  ASSERT_TRUE(tier->insert(block(3, "a")).ok()) << "the erase made room";
  tier->flush();
  tier->close();

  tier = open(o);
  EXPECT_EQ(tier->state_for_testing().namespaces->held("a"), 3 * record) << "recounted from the index";
  EXPECT_EQ(tier->insert(block(4, "a")).status().code(), StatusCode::kNoSpace);
  tier->close();
  o.namespace_quotas = {{"a", 4 * record}};
  tier = open(o);
  EXPECT_TRUE(tier->insert(block(4, "a")).ok()) << "a larger quota takes effect at open";
}

// What the tier wrote and read back, by namespace: every spilled record's padded bytes under its
// own namespace, reads under the namespace of the record read; past the limit of series, new
// namespaces share "other".
TEST_F(SsdTierTest, BytesWrittenAndReadBackAreCountedByNamespace) {
  auto block = [&](uint64_t seed, const std::string& ns) {
    return seeded_block(by_dtype_[2], seed, Values::kRandom, ns);
  };
  auto tier = open();
  for (uint64_t s = 0; s < 4; ++s) ASSERT_TRUE(tier->insert(block(s, "a")).ok());
  ASSERT_TRUE(tier->insert(block(9, "b")).ok());
  tier->flush();
  const uint64_t record =
      (entry_of(*tier, block(0, "a")).length + kRecordAlign - 1) / kRecordAlign * kRecordAlign;
  const NamespaceTraffic& traffic = tier->state_for_testing().traffic;
  EXPECT_EQ(traffic.written_bytes("a"), 4 * record);
  EXPECT_EQ(traffic.written_bytes("b"), record);
  EXPECT_EQ(traffic.read_bytes("a"), 0u);
  for (uint64_t s = 0; s < 2; ++s) ASSERT_TRUE(tier->read(request_for(block(s, "a"))).ok());
  ASSERT_TRUE(tier->read(request_for(block(1, "a"))).ok());
  EXPECT_FALSE(tier->read(request_for(block(7, "a"))).ok());  // a miss reads nothing
  EXPECT_EQ(traffic.read_bytes("a"), 3 * record);  // the padded record, as the disk read it
  EXPECT_EQ(traffic.read_bytes("b"), 0u);
  // The series in the metrics, one per namespace.
  PrometheusTextWriter text;
  tier->visit_metrics(text);
  EXPECT_NE(text.text().find("kvtier_ssd_namespace_written_bytes_total{namespace=\"b\"} " +
                             std::to_string(record)),
            std::string::npos)
      << text.text();

  NamespaceTraffic bounded;
  for (size_t i = 0; i < NamespaceTraffic::kMaxNamespaces + 5; ++i)
    bounded.wrote("ns" + std::to_string(i), 10);
  EXPECT_EQ(bounded.written_bytes("ns0"), 10u);
  EXPECT_EQ(bounded.written_bytes("ns" + std::to_string(NamespaceTraffic::kMaxNamespaces + 2)), 0u);
  EXPECT_EQ(bounded.written_bytes(NamespaceTraffic::kOther), 50u);
}

// Reclaiming a segment gives its namespaces their bytes back.
TEST_F(SsdTierTest, ReclaimedRecordsNoLongerCountAgainstTheirNamespace) {
  auto o = small_ssd_options(dir_.str());
  o.capacity_bytes = 3 << 20;  // three 1 MiB segments
  o.reinsert_read_blocks = false;
  o.namespace_quotas = {{"a", 1 << 20}};
  auto tier = open(o);
  for (uint64_t s = 0; s < 3; ++s) ASSERT_TRUE(tier->insert(seeded_block(by_dtype_[2], s, Values::kRandom, "a")).ok());
  tier->flush();
  NamespaceUsage& usage = *tier->state_for_testing().namespaces;
  EXPECT_GT(usage.held("a"), 0u);
  for (uint64_t s = 10; s < 260; ++s) {  // ~5 MiB of b: a's segment is reclaimed
    ASSERT_TRUE(tier->insert(seeded_block(by_dtype_[2], s, Values::kRandom, "b")).ok());
    if (s % 20 == 0) tier->flush();
  }
  tier->flush();
  EXPECT_FALSE(tier->contains(seeded_block(by_dtype_[2], 0, Values::kRandom, "a")->hash()));
  EXPECT_EQ(usage.held("a"), 0u);
}

TEST_F(SsdTierTest, EraseRemovesQueuedAndWrittenBlocks) {
  auto tier = open();
  BlockRef a = seeded_block(by_dtype_[2], 1);
  ASSERT_TRUE(tier->insert(a).ok());
  tier->flush();
  EXPECT_TRUE(tier->erase(a->hash()));
  EXPECT_FALSE(tier->contains(a->hash()));
  EXPECT_FALSE(tier->read(request_for(a)).ok());
  tier->close();
  tier = open();
  EXPECT_FALSE(tier->contains(a->hash())) << "erased for good";
}

// A client chooses the hashes it PUTs. One whose hash is another block's with its 8-byte words in
// another order (what the in-memory set of held blocks took for the same block while its
// fingerprint was the words' XOR) is a block of its own: it is written, not refused as present;
// both read back as their own bytes; deleting it leaves the other held and readable, across a
// restart too.
TEST_F(SsdTierTest, AHashWithAnotherBlocksWordsReorderedIsABlockOfItsOwn) {
  auto tier = open();
  BlockRef a = seeded_block(by_dtype_[2], 1);
  Block b_block = testing::make_block(by_dtype_[2], 2);
  b_block.mutable_identity() = a->identity();
  BlockHash& hb = b_block.mutable_identity().hash;
  std::rotate(hb.bytes.begin(), hb.bytes.begin() + 8, hb.bytes.end());  // words 1, 2, 3, 0
  ASSERT_NE(hb, a->hash());
  const BlockRef b = std::make_shared<const Block>(std::move(b_block));
  ASSERT_EQ(*tier->insert(a), InsertOutcome::kInserted);
  tier->flush();
  ASSERT_EQ(*tier->insert(b), InsertOutcome::kInserted) << "refused as if it were the other block";
  tier->flush();
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round == 0 ? "before the restart" : "after it");
    for (const BlockRef& want : {a, b}) {
      auto got = tier->read(request_for(want));
      ASSERT_TRUE(got.ok()) << got.status().to_string();
      EXPECT_TRUE(testing::same_bytes(**got, *want));
    }
    tier->close();
    tier = open();
  }
  EXPECT_TRUE(tier->erase(b->hash()));
  EXPECT_FALSE(tier->contains(b->hash()));
  EXPECT_TRUE(tier->contains(a->hash())) << "deleting one forgot the other";
  EXPECT_TRUE(tier->contains_many(std::vector<BlockHash>{a->hash()}).front());
  auto got = tier->read(request_for(a));
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(testing::same_bytes(**got, *a));
}

TEST_F(SsdTierTest, ASecondProcessCannotOpenTheSameDirectory) {
  auto first = open();
  auto second = SsdTier::open(small_ssd_options(dir_.str()), layouts_);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find("in use by another process"), std::string::npos);
}

TEST_F(SsdTierTest, AnIncompatibleDirectoryIsAClearErrorAndResetWipesItOnPurpose) {
  BlockRef a = seeded_block(by_dtype_[2], 1);
  {
    auto tier = open();
    ASSERT_TRUE(tier->insert(a).ok());
    tier->flush();
  }
  auto o = small_ssd_options(dir_.str());
  o.segment_size = 2 << 20;
  auto other_size = SsdTier::open(o, layouts_);
  ASSERT_FALSE(other_size.ok());
  EXPECT_NE(other_size.status().message().find("--ssd-reset"), std::string::npos)
      << other_size.status().message();

  // A manifest from a future format version.
  const std::string manifest = dir_.str() + "/MANIFEST.json";
  std::ifstream in(manifest);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto at = text.find("\"version\": 1");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 12, "\"version\": 9");
  std::ofstream(manifest, std::ios::trunc) << text;
  auto future = SsdTier::open(small_ssd_options(dir_.str()), layouts_);
  ASSERT_FALSE(future.ok());
  EXPECT_NE(future.status().message().find("format version 9"), std::string::npos);

  auto reset = small_ssd_options(dir_.str());
  reset.reset = true;
  auto tier = open(reset);
  EXPECT_FALSE(tier->contains(a->hash()));
}

TEST_F(SsdTierTest, ADirectoryWithDataButNoManifestIsRefused) {
  { auto tier = open(); }
  std::filesystem::remove(dir_.str() + "/MANIFEST.json");
  auto t = SsdTier::open(small_ssd_options(dir_.str()), layouts_);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("no MANIFEST.json"), std::string::npos);
}

TEST_F(SsdTierTest, LayoutsRecordedInTheManifestStayDecodableAfterRestart) {
  auto other = std::make_shared<LayoutRegistry>();  // a process configured with no layouts
  KvLayout odd = KvLayout::uniform("odd", 3, 1, 32, 8, DType::kF16);
  BlockRef b = seeded_block(*layouts_->add(odd), 5);
  {
    auto tier = open();
    ASSERT_TRUE(tier->insert(b).ok());
    tier->flush();
  }
  auto t = SsdTier::open(small_ssd_options(dir_.str()), other);
  ASSERT_TRUE(t.ok());
  auto got = (*t)->read(request_for(b));
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(testing::same_bytes(**got, *b));
}

TEST_F(SsdTierTest, AFullDiskFailsWritesCleanlyAndKeepsServingReads) {
  testing::SmallFilesystem fs(6 << 20);
  if (!fs.mounted()) {
    GTEST_SKIP() << "cannot mount a small tmpfs here (" << std::strerror(fs.error())
                 << "); ENOSPC is not exercised";
  }
  auto o = small_ssd_options(fs.path());
  o.capacity_bytes = 64 << 20;  // far more than the 6 MiB file system
  auto tier = open(o);
  std::vector<BlockRef> blocks;
  for (uint64_t s = 0; s < 400; ++s) {
    blocks.push_back(seeded_block(by_dtype_[2], s));
    (void)tier->insert(blocks.back());
    if (s % 10 == 0) tier->flush();
  }
  tier->flush();
  const auto& m = tier->metrics();
  EXPECT_GT(m.spill_failed_no_space.value() + m.spill_failed_index.value(), 0u);
  EXPECT_GT(m.spill_written.value(), 0u);
  EXPECT_EQ(m.spill_written.value() + m.spill_failed_no_space.value() + m.spill_failed_index.value() +
                m.spill_failed_io.value(),
            m.spill_enqueued.value())
      << "every accepted block is accounted for";
  // Everything that was written still reads back exactly.
  size_t served = 0;
  for (const auto& b : blocks) {
    auto got = tier->read(request_for(b));
    if (got.ok()) {
      ++served;
      EXPECT_TRUE(testing::same_bytes(**got, *b));
    }
  }
  EXPECT_GE(served, m.spill_written.value() - m.segments_reclaimed.value() * 60);
  EXPECT_GT(served, 0u);
  EXPECT_EQ(m.corrupt_total(), 0u);
}

// kvtier_ssd_written_never_read_bytes: of a 1-in-64 sample of the blocks written, those that left
// (reclaimed or erased) are counted by whether a read served them first, scaled up by 64.
TEST_F(SsdTierTest, BlocksThatLeaveAreCountedAsReadOrWrittenForNothingFromASample) {
  auto o = small_ssd_options(dir_.str());
  o.capacity_bytes = 4 << 20;  // four 1 MiB segments: most of what is written is reclaimed
  o.reinsert_read_blocks = false;
  auto tier = open(o);
  uint64_t expect_read = 0, expect_never_read = 0;
  size_t sampled = 0;
  std::vector<BlockRef> batch;
  for (uint64_t s = 0; s < 1600; ++s) {
    batch.push_back(seeded_block(by_dtype_[2], s));
    ASSERT_TRUE(tier->insert(batch.back()).ok());
    if (batch.size() < 40) continue;
    tier->flush();
    // Every third block of the batch is read while it is surely still there.
    for (size_t i = 0; i < batch.size(); ++i) {
      const BlockRef& b = batch[i];
      const bool read = i % 3 == 0 && tier->read(request_for(b)).ok();
      if (!WriteOutcomeSample::sampled(b->hash())) continue;
      ++sampled;
      const uint64_t bytes = record_padded(entry_of(*tier, b).length) * WriteOutcomeSample::kOneIn;
      (read ? expect_read : expect_never_read) += bytes;
    }
    batch.clear();
  }
  ASSERT_GT(tier->metrics().segments_reclaimed.value(), 0u);
  // What reclaim left behind leaves by erase.
  for (uint64_t s = 0; s < 1600; ++s) {
    const BlockHash h = seeded_block(by_dtype_[2], s)->hash();
    if (tier->contains(h)) {
      ASSERT_TRUE(tier->erase(h));
    }
  }
  ASSERT_GT(sampled, 8u) << "1600 blocks give about 25 sampled ones";
  EXPECT_GT(expect_read, 0u);
  EXPECT_GT(expect_never_read, 0u);
  EXPECT_EQ(tier->metrics().left_read_bytes.value(), expect_read);
  EXPECT_EQ(tier->metrics().left_never_read_bytes.value(), expect_never_read);
}

}  // namespace
}  // namespace kvtier
