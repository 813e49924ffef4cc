#include "tiers/ram_tier.h"

#include <algorithm>
#include <map>
#include <random>

#include <gtest/gtest.h>

#include "tests/support/test_blocks.h"

namespace kvtier {
namespace {

std::shared_ptr<const KvLayout> micro_layout() {
  static auto l = testing::share(KvLayout::uniform("micro", 1, 1, 8, 4, DType::kBF16));
  return l;
}

BlockRef block(uint64_t seed, std::shared_ptr<const KvLayout> layout = micro_layout()) {
  return std::make_shared<const Block>(testing::make_block(layout, seed));
}

BlockRequest req(const BlockRef& b) { return {b->hash(), b->identity().token_ids}; }

struct Fixture {
  explicit Fixture(uint64_t capacity_blocks, std::optional<Quantization> q = std::nullopt) {
    block_bytes = block(0)->size_bytes();
    RamTierOptions o;
    o.capacity_bytes = capacity_blocks * block_bytes;
    o.quantization = q;
    o.eviction = "lru";  // these tests spell out LRU's order; the policies have their own tests
    tier = std::make_unique<RamTier>(o);
    tier->set_eviction_sink([this](BlockRef b) { evicted.push_back(b->hash()); });
  }
  uint64_t block_bytes;
  std::unique_ptr<RamTier> tier;
  std::vector<BlockHash> evicted;
};

TEST(RamTierTest, EvictsLeastRecentlyUsedFirst) {
  Fixture f(3);
  auto a = block(1), b = block(2), c = block(3), d = block(4);
  for (auto& x : {a, b, c}) ASSERT_TRUE(f.tier->insert(x).ok());
  ASSERT_TRUE(f.tier->read(req(a)).ok());  // a becomes most recent: b is now the oldest
  ASSERT_TRUE(f.tier->insert(d).ok());
  ASSERT_EQ(f.evicted.size(), 1u);
  EXPECT_EQ(f.evicted[0], b->hash());
  EXPECT_FALSE(f.tier->contains(b->hash()));
  auto e = block(5);
  ASSERT_TRUE(f.tier->insert(e).ok());
  EXPECT_EQ(f.evicted.back(), c->hash()) << "then c, the oldest after b";
}

TEST(RamTierTest, PinnedBlocksAreNeverEvicted) {
  Fixture f(2);
  auto a = block(1), b = block(2), c = block(3);
  ASSERT_TRUE(f.tier->insert(a).ok());
  ASSERT_TRUE(f.tier->insert(b).ok());
  ASSERT_TRUE(f.tier->pin(a->hash()));
  ASSERT_TRUE(f.tier->insert(c).ok());
  EXPECT_EQ(f.evicted, std::vector<BlockHash>{b->hash()}) << "a is older but pinned";
  EXPECT_TRUE(f.tier->contains(a->hash()));
}

TEST(RamTierTest, InsertWithEverythingPinnedFailsAndChangesNothing) {
  Fixture f(2);
  auto a = block(1), b = block(2), c = block(3);
  ASSERT_TRUE(f.tier->insert(a).ok());
  ASSERT_TRUE(f.tier->insert(b).ok());
  ASSERT_TRUE(f.tier->pin(a->hash()));
  ASSERT_TRUE(f.tier->pin(b->hash()));
  auto r = f.tier->insert(c);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(f.tier->block_count(), 2u);
  EXPECT_TRUE(f.evicted.empty());
  EXPECT_EQ(f.tier->metrics().rejected_no_room.value(), 1u);
  f.tier->unpin(a->hash());
  EXPECT_TRUE(f.tier->insert(c).ok()) << "room again once a pin is released";
}

TEST(RamTierTest, PinsNest) {
  Fixture f(1);
  auto a = block(1), b = block(2);
  ASSERT_TRUE(f.tier->insert(a).ok());
  ASSERT_TRUE(f.tier->pin(a->hash()));
  ASSERT_TRUE(f.tier->pin(a->hash()));
  f.tier->unpin(a->hash());
  EXPECT_FALSE(f.tier->insert(b).ok()) << "still pinned once";
  f.tier->unpin(a->hash());
  EXPECT_TRUE(f.tier->insert(b).ok());
}

TEST(RamTierTest, PinManyPinsAndReadsEachHeldBlockAsPinAndReadWould) {
  Fixture f(3);
  auto a = block(1), b = block(2), c = block(3), absent = block(4), d = block(5);
  for (auto& x : {a, b, c}) ASSERT_TRUE(f.tier->insert(x).ok());
  const uint64_t hits = f.tier->metrics().hits.value();
  const std::vector<BlockRequest> asked = {req(b), req(absent), req(a)};
  const std::vector<Tier::PinResult> got = f.tier->pin_many(asked);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_TRUE(got[0].pinned);
  EXPECT_EQ(got[0].block, b) << "the held block itself, not a copy";
  EXPECT_FALSE(got[1].pinned);
  EXPECT_EQ(got[1].block, nullptr);
  EXPECT_TRUE(got[2].pinned);
  EXPECT_EQ(got[2].block, a);
  EXPECT_EQ(f.tier->metrics().hits.value(), hits + 2) << "counted as two reads";
  EXPECT_EQ(f.tier->metrics().pinned_blocks.value(), 2);
  // Pinned: a full tier evicts c, the one left unpinned, though a and b are older.
  ASSERT_TRUE(f.tier->insert(d).ok());
  EXPECT_EQ(f.evicted, std::vector<BlockHash>{c->hash()});
  f.tier->unpin_many(std::vector<BlockHash>{a->hash(), b->hash()});
  EXPECT_EQ(f.tier->metrics().pinned_blocks.value(), 0);
}

TEST(RamTierTest, BlockLargerThanTheTierIsRejected) {
  Fixture f(1);
  auto big = block(1, testing::share(KvLayout::uniform("big", 2, 1, 8, 4, DType::kBF16)));
  auto r = f.tier->insert(big);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f.tier->used_bytes(), 0u);
}

TEST(RamTierTest, DuplicateInsertIsANoOp) {
  Fixture f(2);
  auto a = block(1);
  ASSERT_EQ(*f.tier->insert(a), InsertOutcome::kInserted);
  ASSERT_EQ(*f.tier->insert(a), InsertOutcome::kAlreadyPresent);
  EXPECT_EQ(f.tier->used_bytes(), f.block_bytes);
}

TEST(RamTierTest, ProbeComparesTokens) {
  Fixture f(2);
  auto a = block(1);
  ASSERT_TRUE(f.tier->insert(a).ok());
  EXPECT_EQ(f.tier->probe(req(a)), Tier::Presence::kSameTokens);
  std::vector<uint32_t> other = a->identity().token_ids;
  other[0] ^= 1;
  EXPECT_EQ(f.tier->probe({a->hash(), other}), Tier::Presence::kDifferentTokens);
  EXPECT_EQ(f.tier->probe(req(block(9))), Tier::Presence::kAbsent);
}

TEST(RamTierTest, QuantizationOnInsertHoldsMoreAndKeepsNonFiniteBlocksDense) {
  auto layout = testing::share(KvLayout::uniform("q", 2, 2, 64, 16, DType::kBF16));
  RamTierOptions o;
  o.capacity_bytes = 64 << 20;
  o.quantization = Quantization{4, 64};
  RamTier tier(o);
  auto dense = std::make_shared<const Block>(testing::make_block(layout, 1, testing::Values::kKvLike));
  ASSERT_TRUE(tier.insert(dense).ok());
  auto held = tier.read(req(dense));
  ASSERT_TRUE(held.ok());
  EXPECT_TRUE((*held)->is_quantized(0));
  EXPECT_LT(tier.used_bytes(), dense->size_bytes() / 3);
  EXPECT_TRUE(testing::same_bytes((*held)->dequantized(),
                                  std::move(dense->quantized({4, 64})).value().dequantized()));

  auto specials = std::make_shared<const Block>(testing::make_block(layout, 2, testing::Values::kWithSpecials));
  ASSERT_TRUE(tier.insert(specials).ok());
  EXPECT_FALSE((*tier.read(req(specials)))->any_quantized());
  EXPECT_EQ(tier.metrics().quantize_skipped.value(), 1u);
}

// A plain model of the same policy: a vector in recency order, scanned linearly.
class ReferenceLru {
 public:
  explicit ReferenceLru(uint64_t capacity) : capacity_(capacity) {}
  struct Item {
    BlockHash hash;
    uint64_t bytes;
    int pins;
  };
  // Returns evicted hashes, or nullopt when the insert must fail.
  std::optional<std::vector<BlockHash>> insert(const BlockHash& h, uint64_t bytes) {
    if (find(h)) return std::vector<BlockHash>{};
    uint64_t evictable = 0;
    for (const Item& i : items_) evictable += i.pins == 0 ? i.bytes : 0;
    if (used() + bytes > capacity_ + evictable || bytes > capacity_) return std::nullopt;
    std::vector<BlockHash> out;
    while (used() + bytes > capacity_) {
      auto it = std::find_if(items_.begin(), items_.end(), [](const Item& i) { return i.pins == 0; });
      out.push_back(it->hash);
      items_.erase(it);
    }
    items_.push_back({h, bytes, 0});
    return out;
  }
  bool touch(const BlockHash& h) {
    auto it = std::find_if(items_.begin(), items_.end(), [&](const Item& i) { return i.hash == h; });
    if (it == items_.end()) return false;
    Item item = *it;
    if (item.pins == 0) {
      items_.erase(it);
      items_.push_back(item);
    }
    return true;
  }
  bool pin(const BlockHash& h) {
    Item* i = find(h);
    if (!i) return false;
    ++i->pins;
    return true;
  }
  void unpin(const BlockHash& h) {
    auto it = std::find_if(items_.begin(), items_.end(), [&](const Item& i) { return i.hash == h; });
    if (it == items_.end() || it->pins == 0) return;
    if (--it->pins == 0) {  // unpinned blocks re-enter as most recent
      Item item = *it;
      items_.erase(it);
      items_.push_back(item);
    }
  }
  bool erase(const BlockHash& h) {
    auto it = std::find_if(items_.begin(), items_.end(), [&](const Item& i) { return i.hash == h; });
    if (it == items_.end()) return false;
    items_.erase(it);
    return true;
  }
  uint64_t used() const {
    uint64_t u = 0;
    for (const Item& i : items_) u += i.bytes;
    return u;
  }
  std::vector<BlockHash> unpinned_order() const {
    std::vector<BlockHash> out;
    for (const Item& i : items_) {
      if (i.pins == 0) out.push_back(i.hash);
    }
    return out;
  }
  size_t size() const { return items_.size(); }

 private:
  Item* find(const BlockHash& h) {
    for (Item& i : items_) {
      if (i.hash == h) return &i;
    }
    return nullptr;
  }
  uint64_t capacity_;
  std::vector<Item> items_;
};

TEST(RamTierTest, MatchesAReferenceModelOverRandomOperations) {
  // Blocks of two sizes, so eviction must free bytes, not count blocks.
  auto small = micro_layout();
  auto large = testing::share(KvLayout::uniform("micro2", 3, 1, 8, 4, DType::kBF16));
  std::vector<BlockRef> pool;
  for (uint64_t i = 0; i < 64; ++i) pool.push_back(block(i, i % 3 ? small : large));
  const uint64_t capacity = 12 * pool[1]->size_bytes();
  RamTierOptions o;
  o.capacity_bytes = capacity;
  o.eviction = "lru";
  RamTier tier(o);
  std::vector<BlockHash> evicted;
  tier.set_eviction_sink([&](BlockRef b) { evicted.push_back(b->hash()); });
  ReferenceLru model(capacity);
  std::map<BlockHash, int> pins;

  std::mt19937_64 rng(2024);
  const int kOps = 150'000;
  for (int op = 0; op < kOps; ++op) {
    const BlockRef& b = pool[rng() % pool.size()];
    const BlockHash& h = b->hash();
    switch (rng() % 10) {
      case 0: case 1: case 2: case 3: {
        evicted.clear();
        auto want = model.insert(h, b->size_bytes());
        auto got = tier.insert(b);
        ASSERT_EQ(got.ok(), want.has_value()) << "op " << op;
        if (want) {
          ASSERT_EQ(evicted, *want) << "op " << op;
        }
        break;
      }
      case 4: case 5: case 6:
        ASSERT_EQ(tier.read({h, b->identity().token_ids}).ok(), model.touch(h)) << "op " << op;
        break;
      case 7:
        if (pins.size() < 8) {
          bool p = tier.pin(h);
          ASSERT_EQ(p, model.pin(h)) << "op " << op;
          if (p) ++pins[h];
        }
        break;
      case 8:
        if (!pins.empty()) {
          auto it = pins.begin();
          std::advance(it, rng() % pins.size());
          tier.unpin(it->first);
          model.unpin(it->first);
          if (--it->second == 0) pins.erase(it);
        }
        break;
      case 9:
        if (!pins.count(h)) {
          ASSERT_EQ(tier.erase(h), model.erase(h)) << "op " << op;
        }
        break;
    }
    ASSERT_LE(tier.used_bytes(), capacity) << "op " << op;
    ASSERT_EQ(tier.used_bytes(), model.used()) << "op " << op;
    ASSERT_EQ(tier.block_count(), model.size()) << "op " << op;
    if (op % 97 == 0) {
      ASSERT_EQ(tier.unpinned_count(), model.unpinned_order().size()) << "op " << op;
    }
  }
}

// The sink runs outside the tier's lock; a reader that looked between the block leaving the index
// and the sink taking it found it in no tier (a miss for a block nobody deleted).
TEST(RamTierTest, ABlockOnItsWayToTheSinkIsStillFoundAndRead) {
  RamTierOptions o;
  o.capacity_bytes = block(0)->size_bytes();
  RamTier tier(o);
  const BlockRef first = block(1), second = block(2);
  int sunk = 0;
  tier.set_eviction_sink([&](BlockRef b) {
    ++sunk;
    EXPECT_EQ(b->hash(), first->hash());
    EXPECT_TRUE(tier.contains(first->hash()));
    EXPECT_EQ(tier.contains_many(std::vector<BlockHash>{first->hash()}), std::vector<bool>{true});
    EXPECT_EQ(tier.probe(req(first)), Tier::Presence::kSameTokens);
    auto r = tier.read(req(first));
    ASSERT_TRUE(r.ok());
    EXPECT_TRUE(testing::same_bytes(**r, *first));
    EXPECT_FALSE(tier.pin(first->hash())) << "leaving: readable, not pinnable";
  });
  ASSERT_TRUE(tier.insert(first).ok());
  ASSERT_TRUE(tier.insert(second).ok());
  EXPECT_EQ(sunk, 1);
  EXPECT_FALSE(tier.contains(first->hash())) << "gone once the sink has it";
  EXPECT_FALSE(tier.read(req(first)).ok());
}

}  // namespace
}  // namespace kvtier
