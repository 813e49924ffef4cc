// Adaptive eviction inside a real RamTier, against its two candidates run alone on the same
// requests: it follows the one that suits the traffic, changes when the traffic does, and never
// changes on traffic both suit alike.
#include <sstream>

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "tests/support/test_blocks.h"
#include "tiers/ram_tier.h"

namespace kvtier {
namespace {

using Prompt = std::vector<BlockRef>;

class AdaptiveEvictionTest : public ::testing::Test {
 protected:
  struct Outcome {
    uint64_t hits = 0;  // blocks found, counted from the request `count_from` on
    std::string active;
    uint64_t changes = 0;
  };

  // A prompt of `n` new blocks, each the child of the one before (the first extends `base`'s
  // last block, or starts a chain).
  Prompt prompt(size_t n, const Prompt& base = {}) {
    Prompt p = base;
    for (size_t i = 0; i < n; ++i) {
      Block b = testing::make_block(layout_, next_seed_++);
      b.mutable_identity().parent_hash = p.empty() ? BlockHash{} : p.back()->hash();
      p.push_back(std::make_shared<const Block>(std::move(b)));
    }
    return p;
  }

  // As an engine does: the cached prefix read in order, the rest computed and inserted.
  static uint64_t serve(RamTier& tier, const Prompt& p) {
    size_t i = 0;
    while (i < p.size() && tier.read({p[i]->hash(), {}}).ok()) ++i;
    for (size_t j = i; j < p.size(); ++j) (void)tier.insert(p[j]);
    return i;
  }

  Outcome replay(const std::string& eviction, const std::vector<Prompt>& requests,
                 size_t count_from, size_t capacity_blocks) {
    RamTierOptions o;
    o.eviction = eviction;
    o.capacity_bytes = capacity_blocks * testing::make_block(layout_, 0).size_bytes();
    RamTier tier(o);
    Outcome out;
    for (size_t r = 0; r < requests.size(); ++r) {
      const uint64_t hits = serve(tier, requests[r]);
      if (r >= count_from) out.hits += hits;
    }
    out.active = tier.eviction_policy_active();
    out.changes = tier.eviction_policy_changes();
    return out;
  }

  // Eight short prompts, each asked for twice in a row, again and again between runs of one-off
  // one-block prompts, more of them than the tier holds: LRU orders (chain-lru among them) let
  // each run flush the hot prompts; S3-FIFO promotes those, read while on probation, and the
  // one-offs never leave probation. (One long one-off prompt would not do: chain-lru gives up
  // its head and then the rest of it as orphans.)
  std::vector<Prompt> hot_and_scans(size_t rounds) {
    std::vector<Prompt> hot;
    for (int i = 0; i < 8; ++i) hot.push_back(prompt(2));
    std::vector<Prompt> out;
    for (size_t r = 0; r < rounds; ++r) {
      for (const Prompt& p : hot) out.insert(out.end(), {p, p});
      for (int k = 0; k < 60; ++k) out.push_back(prompt(1));
    }
    return out;
  }

  // Ten conversations taking turns, each turn its history and two new blocks, restarting after
  // eight: the working set fits, but a turn's new blocks are read again only after the nine other
  // conversations' turns, past S3-FIFO's probation; LRU keeps them.
  std::vector<Prompt> conversations(size_t rounds) {
    std::vector<Prompt> history(10);
    std::vector<Prompt> out;
    for (size_t r = 0; r < rounds; ++r) {
      for (Prompt& h : history) {
        h = prompt(2, h.size() >= 8 ? Prompt{} : h);
        out.push_back(h);
      }
    }
    return out;
  }

  std::shared_ptr<const KvLayout> layout_ =
      testing::share(KvLayout::uniform("t", 1, 1, 8, 16, DType::kBF16));
  uint64_t next_seed_ = 1;
};

TEST_F(AdaptiveEvictionTest, FollowsS3FifoWhereItHitsMoreAndKeepsMostOfItsHits) {
  const std::vector<Prompt> requests = hot_and_scans(300);
  const size_t later = requests.size() / 2;
  const Outcome chain = replay("chain-lru", requests, later, 40);
  const Outcome s3 = replay("s3fifo", requests, later, 40);
  std::ostringstream log;  // an operator is told of the change
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>(
      "capture", std::make_shared<spdlog::sinks::ostream_sink_mt>(log)));
  const Outcome adaptive = replay("adaptive", requests, later, 40);
  spdlog::set_default_logger(previous);
  EXPECT_NE(log.str().find("tier: eviction now follows s3fifo (change 1)"), std::string::npos)
      << log.str();
  // chain-lru finds the hot prompts only on their second asking, S3-FIFO on both.
  ASSERT_GT(s3.hits * 2, chain.hits * 3)
      << "the trace must favour S3-FIFO for this test to mean anything";
  EXPECT_EQ(adaptive.active, "s3fifo");
  EXPECT_GE(adaptive.changes, 1u);
  EXPECT_GE(adaptive.hits * 10, s3.hits * 9)
      << "adaptive " << adaptive.hits << ", s3fifo " << s3.hits;
}

TEST_F(AdaptiveEvictionTest, StaysWithChainLruWhereItHitsMoreAndMatchesItExactly) {
  const std::vector<Prompt> requests = conversations(300);
  const Outcome chain = replay("chain-lru", requests, 0, 100);
  const Outcome s3 = replay("s3fifo", requests, 0, 100);
  const Outcome adaptive = replay("adaptive", requests, 0, 100);
  ASSERT_GT(chain.hits, s3.hits)
      << "the trace must favour chain-lru for this test to mean anything";
  EXPECT_EQ(adaptive.active, "chain-lru");
  EXPECT_EQ(adaptive.changes, 0u);
  EXPECT_EQ(adaptive.hits, chain.hits)
      << "while it follows chain-lru it evicts exactly as chain-lru";
}

TEST_F(AdaptiveEvictionTest, ChangesBackWhenTheTrafficChanges) {
  std::vector<Prompt> requests = hot_and_scans(300);
  const std::vector<Prompt> then = conversations(600);
  requests.insert(requests.end(), then.begin(), then.end());
  RamTierOptions o;
  o.eviction = "adaptive";
  o.capacity_bytes = 60 * testing::make_block(layout_, 0).size_bytes();
  RamTier tier(o);
  for (size_t r = 0; r < requests.size(); ++r) {
    serve(tier, requests[r]);
    if (r + 1 == requests.size() - then.size()) {
      EXPECT_EQ(tier.eviction_policy_active(), "s3fifo");
    }
  }
  EXPECT_EQ(tier.eviction_policy_active(), "chain-lru");
  EXPECT_GE(tier.eviction_policy_changes(), 2u);
  EXPECT_EQ(tier.eviction_policy(), "adaptive");
}

TEST_F(AdaptiveEvictionTest, BlocksPinnedAcrossAChangeOfLeadStayAndTheBytesAddUp) {
  // The candidate that takes over learns of reads late (from the log), but of pins at once: a
  // block pinned before the change is never its victim.
  std::vector<Prompt> requests = hot_and_scans(300);
  RamTierOptions o;
  o.eviction = "adaptive";
  const uint64_t block_bytes = testing::make_block(layout_, 0).size_bytes();
  o.capacity_bytes = 40 * block_bytes;
  RamTier tier(o);
  std::vector<BlockRef> evicted;
  tier.set_eviction_sink([&](BlockRef b) { evicted.push_back(std::move(b)); });
  std::vector<BlockHash> pinned;
  for (size_t r = 0; r < requests.size(); ++r) {
    serve(tier, requests[r]);
    if (r == 20) {  // a one-off block and a hot one, pinned while chain-lru still leads
      for (const BlockRef& b : {requests[18].front(), requests[0].front()}) {
        ASSERT_TRUE(tier.pin(b->hash()));
        pinned.push_back(b->hash());
      }
    }
  }
  ASSERT_EQ(tier.eviction_policy_active(), "s3fifo")
      << "the lead must have changed for this test to mean anything";
  for (const BlockHash& h : pinned) {
    EXPECT_TRUE(tier.contains(h));
    for (const BlockRef& e : evicted) EXPECT_NE(e->hash(), h) << "a pinned block was evicted";
  }
  EXPECT_LE(tier.used_bytes(), o.capacity_bytes);
  EXPECT_EQ(tier.used_bytes(), tier.block_count() * block_bytes);
  for (const BlockHash& h : pinned) tier.unpin(h);
}

TEST_F(AdaptiveEvictionTest, AFixedPolicyIsItsOwnActivePolicyAndNeverChanges) {
  const Outcome chain = replay("chain-lru", hot_and_scans(20), 0, 40);
  EXPECT_EQ(chain.active, "chain-lru");
  EXPECT_EQ(chain.changes, 0u);
}

}  // namespace
}  // namespace kvtier
