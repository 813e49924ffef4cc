// The SSD index's in-memory set of held blocks: the table itself against std::unordered_set under
// random churn, and the index's answers from memory against RocksDB's across commits and a reopen.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <unordered_set>

#include <gtest/gtest.h>

#include "tests/support/temp_dir.h"
#include "tiers/ssd/index/fingerprint_set.h"
#include "tiers/ssd/index/ssd_index.h"

namespace kvtier::testing {
namespace {

// Fingerprints forced into a few homes, so runs are long and wrap past the table's end: the
// backward shift of a deletion is where an open-addressed table goes wrong.
TEST(FingerprintSetTest, AgreesWithAStdSetUnderChurn) {
  std::mt19937_64 rng(7);
  for (const uint64_t range : {uint64_t{40}, uint64_t{3000}, uint64_t{1} << 40}) {
    SCOPED_TRACE("range " + std::to_string(range));
    FingerprintSet set;
    std::unordered_set<uint64_t> want;
    for (int op = 0; op < 200000; ++op) {
      const uint64_t f = 1 + rng() % range;
      if (rng() % 3 == 0) {
        set.erase(f);
        want.erase(f);
      } else {
        set.insert(f);
        want.insert(f);
      }
      if (op % 997 == 0) {
        for (uint64_t g = 1; g <= std::min<uint64_t>(range, 200); ++g) {
          ASSERT_EQ(set.contains(g), want.count(g) == 1) << "op " << op << " fingerprint " << g;
        }
      }
      ASSERT_EQ(set.size(), want.size());
    }
    for (uint64_t f : want) ASSERT_TRUE(set.contains(f));
    for (uint64_t f : std::vector<uint64_t>(want.begin(), want.end())) set.erase(f);
    EXPECT_EQ(set.size(), 0u);
    EXPECT_FALSE(set.contains(1));
  }
}

// Hashes a client could derive from another block's to share its fingerprint (the SSD tier then
// took the one for the other: a spill refused as present, a delete forgetting the other): its
// words reordered (the XOR fingerprint's weakness), its words' top bits flipped in pairs (where a
// multiply-and-add cancels them whatever its factors), and a top-bit flip chased through a
// multiply-and-xorshift (bit 63 of word 0, bits 63 and 34 of word 1). Each gets a fingerprint of
// its own, for a thousand hashes.
TEST(FingerprintSetTest, HashesDerivedFromAnotherDoNotShareItsFingerprint) {
  std::mt19937_64 rng(11);
  auto flip = [](BlockHash h, size_t word, uint64_t bits) {
    uint64_t w;
    std::memcpy(&w, h.bytes.data() + 8 * word, 8);
    w ^= bits;
    std::memcpy(h.bytes.data() + 8 * word, &w, 8);
    return h;
  };
  constexpr uint64_t kTop = uint64_t{1} << 63;
  for (int n = 0; n < 1000; ++n) {
    BlockHash a;
    for (auto& b : a.bytes) b = static_cast<uint8_t>(rng());
    BlockHash rotated = a, swapped = a;
    std::rotate(rotated.bytes.begin(), rotated.bytes.begin() + 8, rotated.bytes.end());
    std::swap_ranges(swapped.bytes.begin(), swapped.bytes.begin() + 8, swapped.bytes.begin() + 8);
    const BlockHash variants[] = {
        rotated,
        swapped,
        flip(flip(a, 0, kTop), 1, kTop),
        flip(flip(flip(flip(a, 0, kTop), 1, kTop), 2, kTop), 3, kTop),
        flip(flip(a, 0, kTop), 1, kTop | (uint64_t{1} << 34)),
    };
    for (const BlockHash& v : variants) {
      ASSERT_NE(v, a);
      ASSERT_NE(FingerprintSet::fingerprint(v), FingerprintSet::fingerprint(a)) << "hash " << n;
    }
  }
}

BlockHash hash_of(uint32_t i) {
  BlockHash h;
  std::mt19937_64 rng(i);
  for (auto& b : h.bytes) b = static_cast<uint8_t>(rng());
  return h;
}

IndexEntry entry_at(uint64_t offset) {
  IndexEntry e;
  e.segment = 1;
  e.offset = offset;
  e.length = 4096;
  return e;
}

void wait_ready(const SsdIndex& index) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!index.held_set_ready() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_TRUE(index.held_set_ready());
}

std::vector<BlockHash> hashes_of(uint32_t n) {
  std::vector<BlockHash> out;
  for (uint32_t i = 0; i < n; ++i) out.push_back(hash_of(i));
  return out;
}

// The index at `path`, opened, with entries for hashes[0, n) committed in one batch.
std::unique_ptr<SsdIndex> open_with(const std::string& path, const std::vector<BlockHash>& hashes,
                                    size_t n) {
  auto index = SsdIndex::open(path);
  EXPECT_TRUE(index.ok()) << index.status().to_string();
  if (!index.ok()) return nullptr;
  SsdIndex::Batch put;
  for (size_t i = 0; i < n; ++i) put.put(hashes[i], entry_at(i * 4096ull));
  EXPECT_TRUE((*index)->commit(put).ok());
  return std::move(index).value();
}

// What RocksDB holds, key by key.
std::vector<bool> held_in_rocksdb(const SsdIndex& index, const std::vector<BlockHash>& hashes) {
  std::vector<bool> out;
  for (const auto& r : index.multi_get(hashes)) out.push_back(!r.ok() || r->has_value());
  return out;
}

TEST(SsdIndexTest, TheHeldSetAnswersAsRocksDbDoesAcrossCommitsAndAReopen) {
  TempDir dir;
  const std::string path = dir.str() + "/index";
  const std::vector<BlockHash> hashes = hashes_of(3000);
  {
    auto index = open_with(path, hashes, 0);
    ASSERT_NE(index, nullptr);
    wait_ready(*index);
    EXPECT_EQ(index->holds(hashes), std::vector<bool>(hashes.size(), false));
    SsdIndex::Batch put;
    for (uint32_t i = 0; i < 2000; ++i) put.put(hashes[i], entry_at(i * 4096));
    ASSERT_TRUE(index->commit(put).ok());
    SsdIndex::Batch remove;
    for (uint32_t i = 0; i < 2000; i += 3) remove.remove(hashes[i], entry_at(i * 4096));
    for (uint32_t i = 1; i < 2000; i += 7) remove.remove_primary(hashes[i]);
    ASSERT_TRUE(index->commit(remove).ok());
    ASSERT_TRUE(index->put_raw_value(hashes[2500], "damaged").ok());  // held: a read quarantines it
    const auto held = index->holds(hashes);
    ASSERT_TRUE(held.has_value());
    EXPECT_EQ(*held, held_in_rocksdb(*index, hashes));
    EXPECT_TRUE((*held)[2500]);
    EXPECT_FALSE((*held)[0]);
    EXPECT_TRUE((*held)[2]);
  }
  // Reopened: the set is built again from what RocksDB kept, in the background.
  auto index = SsdIndex::open(path);
  ASSERT_TRUE(index.ok());
  wait_ready(**index);
  const auto held = (*index)->holds(hashes);
  ASSERT_TRUE(held.has_value());
  const std::vector<bool> want = held_in_rocksdb(**index, hashes);
  EXPECT_EQ(*held, want);
  EXPECT_EQ((*index)->held_in_memory(),
            static_cast<size_t>(std::count(want.begin(), want.end(), true)));
}

// Commits made after the builder's scan took its snapshot: the snapshot still shows blocks removed
// since, which must not come back, and cannot show blocks put since, which must be there. The hook
// runs on the builder's thread between its snapshot and its first key, so the race is the same on
// every run.
TEST(SsdIndexTest, CommitsDuringTheBuildAreNotUndoneByItsSnapshot) {
  TempDir dir;
  const std::string path = dir.str() + "/index";
  const std::vector<BlockHash> hashes = hashes_of(3000);
  ASSERT_NE(open_with(path, hashes, 2000), nullptr);  // written, closed
  SsdIndexOptions o;
  o.after_scan_snapshot = [&](SsdIndex& index) {
    SsdIndex::Batch b;
    for (uint32_t i = 0; i < 2000; i += 10) b.remove(hashes[i], entry_at(i * 4096ull));
    for (uint32_t i = 2000; i < 2100; ++i) b.put(hashes[i], entry_at(i * 4096ull));
    ASSERT_TRUE(index.commit(b).ok());
    EXPECT_FALSE(index.held_set_ready()) << "the commit lands while the set is being built";
  };
  auto index = SsdIndex::open(path, o);
  ASSERT_TRUE(index.ok());
  wait_ready(**index);
  const auto held = (*index)->holds(hashes);
  ASSERT_TRUE(held.has_value());
  EXPECT_EQ(*held, held_in_rocksdb(**index, hashes));
  EXPECT_FALSE((*held)[0]) << "removed after the snapshot: not brought back";
  EXPECT_TRUE((*held)[2050]) << "put after the snapshot";
  EXPECT_EQ((*index)->held_in_memory(), 2000u - 200u + 100u);
  EXPECT_EQ((*index)->holds(hashes[0]), std::optional<bool>(false));
  EXPECT_EQ((*index)->holds(hashes[1]), std::optional<bool>(true));
}

// kvtier-fsck reads every entry itself: an index opened without the set answers nothing from
// memory (holds() is nullopt), however long one waits, and commits keep no set.
TEST(SsdIndexTest, AnIndexOpenedWithoutTheSetNeverAnswersFromMemory) {
  TempDir dir;
  const std::vector<BlockHash> hashes = hashes_of(100);
  SsdIndexOptions without_set;
  without_set.held_in_memory = false;
  auto index = SsdIndex::open(dir.str() + "/index", without_set);
  ASSERT_TRUE(index.ok());
  SsdIndex::Batch put;
  for (uint32_t i = 0; i < 100; ++i) put.put(hashes[i], entry_at(i * 4096ull));
  ASSERT_TRUE((*index)->commit(put).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE((*index)->held_set_ready());
  EXPECT_FALSE((*index)->holds(hashes).has_value());
  EXPECT_FALSE((*index)->holds(hashes[0]).has_value());
  EXPECT_EQ((*index)->held_in_memory(), 0u);
}

}  // namespace
}  // namespace kvtier::testing
