// The hit-ratio machinery on short traces: traces are deterministic and round-trip as JSON lines,
// Belady's MIN is optimal on cases worked by hand and bounds every policy on a real replay, the
// chain-aware and scan-resistant policies beat LRU where the trace says they should, and SSD
// admission writes less without losing hits. (bench/hit_ratio_bench runs the full traces.)
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "bench/traces/belady.h"
#include "bench/traces/replay.h"
#include "bench/traces/trace_generator.h"
#include "tests/support/temp_dir.h"

namespace kvtier::bench {
namespace {

using kvtier::testing::TempDir;

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const PrefixHasher& hasher() {
  static const auto layout = KvLayout::uniform("replay", 1, 1, 8, 16, DType::kBF16);
  static const PrefixHasher h(HashAlgorithm::kXxh3, Namespace{"replay", layout.fingerprint(), ""}, 16);
  return h;
}

TEST(TracesTest, AreDeterministicAndRoundTripAsJsonLines) {
  TempDir dir;
  for (std::string_view kind : trace_kinds()) {
    auto a = generate_trace(kind, {0.05, 7}), b = generate_trace(kind, {0.05, 7}), c = generate_trace(kind, {0.05, 8});
    ASSERT_TRUE(a.ok() && b.ok() && c.ok());
    const std::string pa = (dir / "a.jsonl").string(), pb = (dir / "b.jsonl").string(), pc = (dir / "c.jsonl").string();
    ASSERT_TRUE(write_trace_jsonl(*a, pa).ok());
    ASSERT_TRUE(write_trace_jsonl(*b, pb).ok());
    ASSERT_TRUE(write_trace_jsonl(*c, pc).ok());
    EXPECT_EQ(slurp(pa), slurp(pb)) << kind << ": same seed, same trace";
    EXPECT_NE(slurp(pa), slurp(pc)) << kind << ": another seed, another trace";
    auto back = read_trace_jsonl(pa);
    ASSERT_TRUE(back.ok());
    ASSERT_EQ(back->requests.size(), a->requests.size());
    for (size_t i = 0; i < a->requests.size(); ++i) {
      EXPECT_EQ(back->requests[i].segments, a->requests[i].segments);
      EXPECT_EQ(back->requests[i].expand(), a->requests[i].expand());
    }
  }
}

// Two prompts sharing a first block, alternating: A = [x, a], B = [x, b], capacity 2 blocks.
TEST(BeladyTest, IsOptimalOnACaseWorkedByHand) {
  BlockTrace t;
  t.block_size = 16;
  t.depth = {0, 1, 1};  // x, a, b
  for (int i = 0; i < 4; ++i) {
    t.requests.push_back({0, 1});
    t.requests.push_back({0, 2});
  }
  // Capacity 2: x is kept throughout (a hit in each of the 7 later requests); the other slot holds
  // a, whose next use always comes before b's, so A's last three requests hit it too. No policy
  // does better: swapping the second block at every request would hit it never.
  EXPECT_EQ(belady(t, 2).hit_blocks, 10u);
  // Capacity 3 holds everything: every block is a hit after its first use.
  EXPECT_EQ(belady(t, 3).hit_blocks, 7u + 6u);
  EXPECT_EQ(belady(t, 1).hit_blocks, 7u) << "only x fits: it is kept";
  EXPECT_EQ(belady(t, 0).hit_blocks, 0u);
}

struct Replays {
  std::unique_ptr<TempDir> dir = std::make_unique<TempDir>();
  Trace trace;
  BlockTrace blocks;
  size_t ram = 0, ssd = 0;
  ReplayResult run(const std::string& eviction, const std::string& admission) {
    auto r = replay(trace, {eviction, admission, ram, ssd, dir->str()});
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() ? *r : ReplayResult{};
  }
};

Replays replays(std::string_view kind, double scale, double ram_fraction, double ssd_fraction) {
  Replays r;
  r.trace = *generate_trace(kind, {scale, 3});
  r.blocks = to_block_trace(r.trace, hasher());
  r.ram = std::max<size_t>(8, static_cast<size_t>(r.blocks.depth.size() * ram_fraction));
  r.ssd = static_cast<size_t>(r.blocks.depth.size() * ssd_fraction);
  return r;
}

// RAM alone at 5 % of the working set, where the order of eviction decides everything.
TEST(HitRatioTest, BeladyBoundsEveryPolicyAndEachPolicyWinsWhereItShould) {
  std::map<std::string, std::map<std::string, double>> ratio;
  for (const char* kind : {"agent", "rag"}) {
    Replays r = replays(kind, 0.05, 0.05, 0.0);
    const double ceiling = static_cast<double>(belady(r.blocks, r.ram).hit_tokens) / r.blocks.prompt_tokens;
    for (const char* policy : {"lru", "chain-lru", "s3fifo", "s3fifo-chain"}) {
      ratio[kind][policy] = r.run(policy, "all").hit_ratio();
      EXPECT_LE(ratio[kind][policy], ceiling + 1e-9) << kind << " " << policy << " above the optimum";
    }
    EXPECT_GT(ceiling, 0.2) << kind << ": capacity too small for the test to mean anything";
  }
  // An agent's prompt outgrows the tier: LRU evicts the prompt's own head while inserting its tail
  // and hits nothing; leaves and orphans first keep the head.
  EXPECT_LT(ratio["agent"]["lru"], 0.05);
  EXPECT_GT(ratio["agent"]["chain-lru"], ratio["agent"]["lru"] + 0.2);
  // RAG's one-off questions and rare documents pass through S3-FIFO's probation.
  EXPECT_GT(ratio["rag"]["s3fifo"], ratio["rag"]["lru"] + 0.05);
}

TEST(HitRatioTest, SeenTwiceAdmissionWritesLessToTheSsdAndCountsWhatItRefuses) {
  Replays r = replays("scan", 0.05, 0.10, 0.5);
  const ReplayResult all = r.run("chain-lru", "all");
  const ReplayResult twice = r.run("chain-lru", "seen-twice");
  EXPECT_GT(all.ssd_blocks_written, 0u);
  EXPECT_LT(twice.ssd_bytes_written, all.ssd_bytes_written / 2) << "one-off documents are never written";
  EXPECT_GT(twice.not_admitted, 0u);
  EXPECT_EQ(all.not_admitted, 0u);
  EXPECT_GT(twice.hit_tokens_ssd, 0u) << "what is used twice still reaches the SSD";
}

}  // namespace
}  // namespace kvtier::bench
