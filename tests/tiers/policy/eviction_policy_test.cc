// Eviction policies alone (the order they choose) and inside a real RamTier (the invariants every
// policy keeps: pinned blocks stay, byte accounting is exact, chains are never left without their
// parents when the policy is chain-aware).
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "tests/support/test_blocks.h"
#include "tiers/policy/admission_policy.h"
#include "tiers/policy/eviction_policy.h"
#include "tiers/policy/write_budget_admission.h"
#include "tiers/ram_tier.h"

namespace kvtier {
namespace {

BlockHash h(uint64_t v) {
  BlockHash out;
  for (int i = 0; i < 8; ++i) out.bytes[i] = static_cast<uint8_t>(v >> (8 * i));
  out.bytes[31] = 1;  // never the zero hash
  return out;
}

std::unique_ptr<EvictionPolicy> policy(std::string_view name) { return std::move(make_eviction_policy(name)).value(); }

// Inserts the chain root -> 1 -> 2 -> 3 and reads it as a prefix fetch does: root first.
void chain_read_in_prefix_order(EvictionPolicy& p) {
  const BlockHash root = h(999);
  for (uint64_t i = 1; i <= 3; ++i) p.inserted(h(i), i == 1 ? root : h(i - 1), 100);
  for (uint64_t i = 1; i <= 3; ++i) p.accessed(h(i));
}

TEST(EvictionPolicyTest, LruGivesUpAChainFromItsRoot) {
  auto p = policy("lru");
  chain_read_in_prefix_order(*p);
  EXPECT_EQ(*p->victim(), h(1)) << "the pathology: the root is the least recently read";
}

TEST(EvictionPolicyTest, ChainLruGivesUpAChainFromItsLeaf) {
  auto p = policy("chain-lru");
  chain_read_in_prefix_order(*p);
  EXPECT_EQ(*p->victim(), h(3));
  p->removed(h(3));
  EXPECT_EQ(*p->victim(), h(2)) << "its parent became the leaf";
}

TEST(EvictionPolicyTest, ChainLruTakesAnInnerBlockOnlyWhenNoLeafIsFree) {
  auto p = policy("chain-lru");
  chain_read_in_prefix_order(*p);
  p->pinned(h(3));
  EXPECT_EQ(*p->victim(), h(1)) << "the only leaf is pinned: the oldest inner block";
  p->pinned(h(1));
  p->pinned(h(2));
  EXPECT_FALSE(p->victim().has_value()) << "everything pinned";
  p->unpinned(h(2));
  EXPECT_EQ(*p->victim(), h(2));
}

// A hybrid chain 1 -> ... -> 6 with a state snapshot after block 3, the snapshot older than the
// blocks past it (it reached this tier first). The blocks past it go first, then the snapshot,
// then the blocks it restored, leaf first: never a snapshot without its blocks, never blocks that
// cannot be resumed kept over one that can.
TEST(EvictionPolicyTest, ChainLruTakesTheBlocksPastASnapshotBeforeIt) {
  auto p = policy("chain-lru");
  const BlockHash root = h(999), snapshot = h(33);
  for (uint64_t i = 1; i <= 3; ++i) p->inserted(h(i), i == 1 ? root : h(i - 1), 100);
  p->inserted_snapshot(snapshot, h(3), 100);
  for (uint64_t i = 4; i <= 6; ++i) p->inserted(h(i), h(i - 1), 100);
  std::vector<BlockHash> order;
  while (auto v = p->victim()) {
    order.push_back(*v);
    p->removed(*v);
  }
  const std::vector<BlockHash> want{h(6), h(5), h(4), snapshot, h(3), h(2), h(1)};
  EXPECT_EQ(order, want);
  // Plain LRU knows nothing of snapshots: the oldest first.
  auto lru = policy("lru");
  for (uint64_t i = 1; i <= 3; ++i) lru->inserted(h(i), i == 1 ? root : h(i - 1), 100);
  lru->inserted_snapshot(snapshot, h(3), 100);
  EXPECT_EQ(*lru->victim(), h(1));
}

TEST(EvictionPolicyTest, S3FifoKeepsBlocksReadTwiceThroughAScan) {
  auto p = policy("s3fifo");
  // Ten hot blocks, read after insertion; then a long scan of blocks read once.
  for (uint64_t i = 0; i < 10; ++i) p->inserted(h(i), h(1000 + i), 100);
  for (uint64_t i = 0; i < 10; ++i) p->accessed(h(i));
  std::set<BlockHash> resident;
  for (uint64_t i = 0; i < 10; ++i) resident.insert(h(i));
  for (uint64_t s = 100; s < 400; ++s) {
    p->inserted(h(s), h(5000 + s), 100);
    resident.insert(h(s));
    while (resident.size() > 20) {
      const BlockHash v = *p->victim();
      p->removed(v);
      resident.erase(v);
    }
  }
  for (uint64_t i = 0; i < 10; ++i) EXPECT_TRUE(resident.count(h(i))) << "hot block " << i << " was flushed";
}

TEST(EvictionPolicyTest, S3FifoSendsABlockTheGhostRemembersToMain) {
  auto p = policy("s3fifo");
  for (uint64_t i = 0; i < 40; ++i) p->inserted(h(i), h(1000 + i), 100);
  const BlockHash first = *p->victim();
  p->removed(first);  // evicted from the small queue unread: remembered
  p->inserted(first, h(1000), 100);  // back soon: straight to main
  for (int k = 0; k < 30; ++k) {
    const BlockHash v = *p->victim();
    EXPECT_NE(v, first) << "evicted from main before the small queue emptied";
    p->removed(v);
  }
}

TEST(EvictionPolicyTest, UnknownNamesAreRefusedWithTheKnownOnes) {
  auto p = make_eviction_policy("arc");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("lru, chain-lru, s3fifo, s3fifo-chain, adaptive, auto"),
            std::string::npos);
  EXPECT_FALSE(make_admission_policy("sometimes").ok());
}

TEST(EvictionPolicyTest, AutoIsAdaptiveForTheLastTierAndChainLruAboveAnother) {
  EXPECT_EQ(resolve_eviction_policy("auto", /*tier_below=*/false), "adaptive");
  EXPECT_EQ(resolve_eviction_policy("auto", /*tier_below=*/true), "chain-lru");
  EXPECT_EQ(resolve_eviction_policy("s3fifo", true), "s3fifo")
      << "a policy named is the policy used";
  EXPECT_EQ(resolve_eviction_policy("lru", false), "lru");
  EXPECT_EQ(policy("auto")->name(), "adaptive") << "a tier alone has nothing below it";
}

TEST(SeenTwiceAdmissionTest, AdmitsABlockUsedTwiceAndItsParentsWheneverItsChildren) {
  SeenTwiceAdmission a;
  const BlockHash parent = h(1), child = h(2), once = h(3);
  a.used(once);
  EXPECT_FALSE(a.admit(once, 4096)) << "computed once, never read";
  for (const BlockHash& b : {parent, child}) a.used(b);  // published as a prompt
  for (const BlockHash& b : {parent, child}) a.used(b);  // fetched as a prefix
  EXPECT_TRUE(a.admit(child, 4096));
  EXPECT_TRUE(a.admit(parent, 4096));
  EXPECT_GE(a.estimate(parent), a.estimate(child));
}

// Collects the gauges and counters a policy shows, by name and first label value.
struct SeenMetrics final : MetricVisitor {
  std::map<std::string, double> values;
  void counter(std::string_view name, std::string_view, const MetricLabels& l,
               uint64_t v) override {
    values[std::string(name) + (l.pairs.empty() ? "" : "/" + l.pairs[0].second)] =
        static_cast<double>(v);
  }
  void gauge(std::string_view name, std::string_view, const MetricLabels&, double v) override {
    values[std::string(name)] = v;
  }
  void histogram(std::string_view, std::string_view, const MetricLabels&,
                 const Histogram::Snapshot&) override {}
};

TEST(WriteBudgetAdmissionTest, AdmissionTightensAsTheBudgetRunsOutAndTheRefusalsAreCounted) {
  double now = 1000;
  // 1000 bytes a second: a bucket of an hour holds 3.6 MB.
  WriteBudgetAdmission a(std::make_unique<AdmitAll>(), 86'400'000, [&] { return now; });
  EXPECT_EQ(a.name(), "all+write-budget");
  constexpr uint64_t kMB = 1'000'000;
  const BlockHash once = h(1), twice = h(2), thrice = h(3), often = h(4);
  a.used(once);
  for (int i = 0; i < 2; ++i) a.used(twice);
  for (int i = 0; i < 3; ++i) a.used(thrice);
  for (int i = 0; i < 9; ++i) a.used(often);
  EXPECT_DOUBLE_EQ(a.bucket_bytes(), 3.6 * kMB) << "a start with a full bucket";
  EXPECT_TRUE(a.admit(once, kMB)) << "more than half full: the rule alone";
  EXPECT_TRUE(a.admit(once, kMB));  // 2.6 MB left before it: still more than half
  EXPECT_EQ(a.uses_required(), 2);  // 1.6 MB: under half
  EXPECT_FALSE(a.admit(once, kMB));
  EXPECT_TRUE(a.admit(twice, kMB));
  EXPECT_EQ(a.uses_required(), 3);  // 0.6 MB: under a quarter
  EXPECT_FALSE(a.admit(twice, kMB));
  EXPECT_TRUE(a.admit(thrice, kMB));  // into debt: -0.4 MB
  EXPECT_EQ(a.uses_required(), 0);
  EXPECT_FALSE(a.admit(often, kMB)) << "an empty bucket admits nothing";
  EXPECT_EQ(a.refused_for_budget(), 3u);
  now += 1200;  // +1.2 MB: 0.8 MB, still under a quarter
  EXPECT_EQ(a.uses_required(), 3);
  now += 1e6;  // a long quiet spell refills no more than an hour
  EXPECT_DOUBLE_EQ(a.bucket_bytes(), 3.6 * kMB);
  EXPECT_EQ(a.uses_required(), 1);

  SeenMetrics m;
  a.visit_metrics(m);
  EXPECT_EQ(m.values["kvtier_ssd_admission_refused_total/write_budget"], 3);
  EXPECT_DOUBLE_EQ(m.values["kvtier_ssd_write_budget_bytes_per_day"], 86'400'000);
  EXPECT_DOUBLE_EQ(m.values["kvtier_ssd_write_budget_available_bytes"], 3.6 * kMB);
  EXPECT_EQ(m.values["kvtier_ssd_write_budget_admitted_bytes_total"], 4 * kMB);
}

TEST(WriteBudgetAdmissionTest, TheRuleUnderItStillDecidesAndItsRefusalsAreNotTheBudgets) {
  auto rule = make_admission_policy("seen-twice", 86'400'000);
  ASSERT_TRUE(rule.ok());
  EXPECT_EQ((*rule)->name(), "seen-twice+write-budget");
  const BlockHash once = h(7);
  (*rule)->used(once);
  EXPECT_FALSE((*rule)->admit(once, 1000)) << "seen-twice refuses a block used once";
  (*rule)->used(once);
  EXPECT_TRUE((*rule)->admit(once, 1000)) << "the rule's own sketch counts the second use";
  SeenMetrics m;
  (*rule)->visit_metrics(m);
  EXPECT_EQ(m.values["kvtier_ssd_admission_refused_total/write_budget"], 0);
  auto plain = make_admission_policy("all", 0);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ((*plain)->name(), "all") << "no budget, no guard";
}

class RamTierPolicyTest : public ::testing::TestWithParam<const char*> {};

// Random inserts (always extending some chain), reads, pins, unpins and erases, checked after
// every operation against what the tier must guarantee whatever its policy.
TEST_P(RamTierPolicyTest, PinnedBlocksStayAndBytesAddUpUnderRandomOperations) {
  auto layout = testing::share(KvLayout::uniform("t", 1, 1, 8, 16, DType::kBF16));
  RamTierOptions o;
  o.eviction = GetParam();
  o.capacity_bytes = 24 * testing::make_block(layout, 0).size_bytes();
  RamTier tier(o);
  std::vector<BlockRef> evicted;
  tier.set_eviction_sink([&](BlockRef b) { evicted.push_back(std::move(b)); });
  std::mt19937_64 rng(7);
  std::map<BlockHash, BlockRef> held;  // what the tier should hold
  std::map<BlockHash, int> pins;
  std::vector<BlockRef> all;
  for (int op = 0; op < 4000; ++op) {
    const int kind = static_cast<int>(rng() % 10);
    if (kind < 5 || all.empty()) {
      Block b = testing::make_block(layout, 10'000 + op);
      // Extend a random earlier block (a chain) or start a new one.
      if (!all.empty() && rng() % 4 != 0) b.mutable_identity().parent_hash = all[rng() % all.size()]->hash();
      auto ref = std::make_shared<const Block>(std::move(b));
      auto r = tier.insert(ref);
      if (r.ok()) {
        held[ref->hash()] = ref;
        all.push_back(ref);
      }
    } else if (kind < 7) {
      const BlockRef& b = all[rng() % all.size()];
      (void)tier.read({b->hash(), {}});
    } else if (kind < 8) {
      const BlockRef& b = all[rng() % all.size()];
      if (tier.pin(b->hash())) ++pins[b->hash()];
    } else if (kind < 9) {
      if (!pins.empty()) {
        auto it = std::next(pins.begin(), static_cast<long>(rng() % pins.size()));
        tier.unpin(it->first);
        if (--it->second == 0) pins.erase(it);
      }
    } else {
      const BlockRef& b = all[rng() % all.size()];
      if (!pins.count(b->hash()) && tier.erase(b->hash())) held.erase(b->hash());
    }
    for (const BlockRef& e : evicted) {
      ASSERT_FALSE(pins.count(e->hash())) << "a pinned block was evicted at op " << op;
      held.erase(e->hash());
    }
    evicted.clear();
    uint64_t bytes = 0;
    for (const auto& [hash, b] : held) {
      ASSERT_TRUE(tier.contains(hash)) << "op " << op;
      bytes += b->size_bytes();
    }
    ASSERT_EQ(tier.used_bytes(), bytes) << "op " << op;
    ASSERT_EQ(tier.block_count(), held.size()) << "op " << op;
    ASSERT_LE(bytes, o.capacity_bytes);
  }
}

// A RAM-only cache under a chain-aware policy never holds a block whose parent it gave up: every
// chain it holds starts at a root.
// Only the chain-aware policies promise this; plain LRU and S3-FIFO may keep orphans by design.
class ChainAwarePolicyTest : public RamTierPolicyTest {};

TEST_P(ChainAwarePolicyTest, LeavesNoOrphans) {
  auto layout = testing::share(KvLayout::uniform("t", 1, 1, 8, 16, DType::kBF16));
  RamTierOptions o;
  o.eviction = GetParam();
  o.capacity_bytes = 32 * testing::make_block(layout, 0).size_bytes();
  RamTier tier(o);
  std::mt19937_64 rng(11);
  std::vector<std::vector<BlockRef>> chains;  // prompts: each extends a random earlier prefix
  const BlockHash root{};
  for (int p = 0; p < 300; ++p) {
    std::vector<BlockRef> chain;
    if (!chains.empty() && rng() % 3 != 0) {
      const auto& base = chains[rng() % chains.size()];
      chain.assign(base.begin(), base.begin() + static_cast<long>(1 + rng() % base.size()));
    }
    for (int k = 0, n = 1 + static_cast<int>(rng() % 6); k < n; ++k) {
      Block b = testing::make_block(layout, 100'000 + p * 16 + k);
      b.mutable_identity().parent_hash = chain.empty() ? root : chain.back()->hash();
      chain.push_back(std::make_shared<const Block>(std::move(b)));
    }
    // As an engine does: read the cached prefix in order, then insert the rest.
    for (const BlockRef& b : chain) {
      if (tier.contains(b->hash())) (void)tier.read({b->hash(), {}});
      else (void)tier.insert(b);
    }
    chains.push_back(chain);
    for (const auto& c : chains) {
      for (const BlockRef& b : c) {
        if (!tier.contains(b->hash())) continue;
        const BlockHash& parent = b->identity().parent_hash;
        ASSERT_TRUE(parent == root || tier.contains(parent)) << "an orphan survived after prompt " << p;
      }
    }
  }
}

std::string policy_test_name(const ::testing::TestParamInfo<const char*>& info) {
  std::string n = info.param;
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
}

INSTANTIATE_TEST_SUITE_P(Policies, RamTierPolicyTest,
                         ::testing::Values("lru", "chain-lru", "s3fifo", "s3fifo-chain",
                                           "adaptive"),
                         policy_test_name);
INSTANTIATE_TEST_SUITE_P(Policies, ChainAwarePolicyTest, ::testing::Values("chain-lru", "s3fifo-chain"),
                         policy_test_name);

}  // namespace
}  // namespace kvtier
