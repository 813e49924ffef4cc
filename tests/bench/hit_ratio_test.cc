// The hit-ratio machinery on short traces: traces are deterministic and round-trip as JSON lines,
// Belady's MIN is optimal on cases worked by hand and bounds every policy on a real replay, the
// chain-aware and scan-resistant policies beat LRU where the trace says they should, and SSD
// admission writes less without losing hits. (bench/hit_ratio_bench runs the full traces.)
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "bench/traces/belady.h"
#include "bench/traces/mooncake_trace.h"
#include "bench/traces/next_use_admission.h"
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

void write_file(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

TEST(TracesTest, MooncakeTracesReadAsEqualPrefixesWhereTheirHashIdsAgree) {
  TempDir dir;
  const std::string path = (dir / "mc.jsonl").string();
  // The README's two requests share their first 12 blocks; a third shares only the first one,
  // and ends in a short block.
  std::string a =
      R"({"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46)";
  for (int id = 47; id <= 57; ++id) a += ", " + std::to_string(id);
  std::string b = a;
  a += ", 2353, 2354]}\n";
  b.replace(b.find("27482"), 5, "30535");
  b.replace(b.find("6955"), 4, "6472");
  b += ", 2366]}\n";
  write_file(path, a + "\n" + b +
                       R"({"timestamp": 31000, "input_length": 600, "hash_ids": [46, 9]})"
                       "\n");
  auto t = read_trace_file(path);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t->block_tokens, kMooncakeBlockTokens);
  ASSERT_EQ(t->requests.size(), 3u);
  EXPECT_DOUBLE_EQ(t->requests[1].ts, 30.535);
  EXPECT_EQ(t->requests[0].tokens(), 6955u);
  EXPECT_EQ(t->requests[1].tokens(), 6472u);
  EXPECT_EQ(t->requests[2].tokens(), 600u);
  EXPECT_EQ(t->requests[0].segments.back().second, 6955u - 13 * 512);
  // Hashed at 512-token blocks as a replay does: 12 shared blocks, then different ones.
  const auto layout = KvLayout::uniform("replay", 1, 1, 8, 512, DType::kBF16);
  const PrefixHasher h(HashAlgorithm::kXxh3, Namespace{"replay", layout.fingerprint(), ""}, 512);
  const auto ha = h.hash_prefix(t->requests[0].expand(), {});
  const auto hb = h.hash_prefix(t->requests[1].expand(), {});
  const auto hc = h.hash_prefix(t->requests[2].expand(), {});
  ASSERT_EQ(ha.size(), 13u);  // 6955 tokens: 13 whole blocks, the rest too short to cache
  ASSERT_EQ(hb.size(), 12u);
  for (size_t i = 0; i < 12; ++i) EXPECT_EQ(ha[i], hb[i]) << i;
  ASSERT_EQ(hc.size(), 1u);
  EXPECT_EQ(hc[0], ha[0]);

  EXPECT_EQ(t->head(0.5).requests.size(), 1u);
  EXPECT_EQ(t->head(1.0).requests.size(), 3u);
}

TEST(TracesTest, AMalformedMooncakeLineIsAClearErrorNamingItsLine) {
  TempDir dir;
  const std::string path = (dir / "bad.jsonl").string();
  const std::string good = R"({"timestamp": 0, "input_length": 600, "hash_ids": [1, 2]})"
                           "\n";
  for (const std::string bad : {R"({"timestamp": 5, "input_length": 1200, "hash_ids": [1, 2]})",
                                R"({"timestamp": 5, "input_length": 400, "hash_ids": [1, 2]})",
                                R"({"timestamp": 5, "input_length": 600, "hash_ids": [1, -2]})",
                                R"({"timestamp": 5, "hash_ids": [1, 2]})", "not json"}) {
    write_file(path, good + bad + "\n");
    auto t = read_mooncake_trace(path);
    ASSERT_FALSE(t.ok()) << bad;
    EXPECT_NE(t.status().message().find("line 2"), std::string::npos) << t.status().to_string();
  }
  EXPECT_FALSE(read_trace_file((dir / "missing.jsonl").string()).ok());
}

TEST(HitRatioTest, AMooncakeTraceReplaysAtItsBlockSize) {
  TempDir dir;
  const std::string path = (dir / "mc.jsonl").string();
  write_file(path, R"({"timestamp": 0, "input_length": 1500, "hash_ids": [1, 2, 3]})"
                   "\n"
                   R"({"timestamp": 1, "input_length": 1300, "hash_ids": [1, 2, 4]})"
                   "\n");
  auto t = read_trace_file(path);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  TempDir scratch;
  auto r = replay(*t, {"lru", "all", 16, 0, scratch.str(), t->block_tokens});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->prompt_tokens, 2800u);
  EXPECT_EQ(r->hit_tokens_ram, 1024u) << "the second request's first two blocks";
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

TEST(NextUseAdmissionTest, AdmitsWhatTheTraceUsesAgainWithinTheHorizon) {
  const auto hash = [](uint8_t v) {
    BlockHash h;
    h.bytes[0] = v;
    return h;
  };
  const BlockHash soon = hash(1), late = hash(2), never = hash(3), unknown = hash(4);
  const std::unordered_map<BlockHash, std::vector<uint32_t>> uses = {
      {soon, {0, 2}}, {late, {0, 5}}, {never, {0}}};
  NextUseAdmission forever(uses, NextUseAdmission::kForever), within3(uses, 3);
  for (NextUseAdmission* p : {&forever, &within3}) p->at_request(1);
  EXPECT_TRUE(forever.admit(soon, 0));
  EXPECT_TRUE(forever.admit(late, 0));
  EXPECT_FALSE(forever.admit(never, 0)) << "not used after request 1";
  EXPECT_FALSE(forever.admit(unknown, 0));
  EXPECT_TRUE(within3.admit(soon, 0)) << "next use 1 request away";
  EXPECT_FALSE(within3.admit(late, 0)) << "next use 4 requests away";
  within3.at_request(2);
  EXPECT_TRUE(within3.admit(late, 0)) << "3 away now";
  forever.at_request(5);
  EXPECT_FALSE(forever.admit(late, 0)) << "its last use is this request";

  NextUseAdmission twice_more(uses, NextUseAdmission::kForever, 2);
  twice_more.at_request(0);
  EXPECT_FALSE(twice_more.admit(soon, 0)) << "one use to come";
  const std::unordered_map<BlockHash, std::vector<uint32_t>> popular = {{soon, {0, 2, 7}}};
  NextUseAdmission popular_twice(popular, NextUseAdmission::kForever, 2);
  popular_twice.at_request(1);
  EXPECT_TRUE(popular_twice.admit(soon, 0)) << "two uses to come";

  EXPECT_EQ(NextUseAdmission::parse("oracle")->horizon, NextUseAdmission::kForever);
  EXPECT_EQ(NextUseAdmission::parse("oracle:30")->horizon, 30u);
  EXPECT_EQ(NextUseAdmission::parse("oracle:30")->min_uses, 1u);
  EXPECT_EQ(NextUseAdmission::parse("oracle:inf:3")->horizon, NextUseAdmission::kForever);
  EXPECT_EQ(NextUseAdmission::parse("oracle:inf:3")->min_uses, 3u);
  EXPECT_EQ(NextUseAdmission::parse("all").status().code(), StatusCode::kNotFound);
  for (const char* bad :
       {"oracle:soon", "oracle:", "oracle:30:", "oracle:30:inf", "oracle:1234567890"})
    EXPECT_EQ(NextUseAdmission::parse(bad).status().code(), StatusCode::kInvalidArgument) << bad;
}

TEST(NextUseAdmissionTest, InAReplayItKeepsAdmitAllsHitsAndWritesOnlyWhatIsReadBack) {
  // An SSD as large as the working set: admit-all loses nothing to the SSD's own evictions, so
  // the clairvoyant rule must hit exactly as often, writing only blocks a later request reads.
  Replays r = replays("chat", 0.05, 0.10, 1.0);
  const ReplayResult all = r.run("chain-lru", "all");
  const ReplayResult oracle = r.run("chain-lru", "oracle");
  EXPECT_EQ(oracle.hit_tokens_ram + oracle.hit_tokens_ssd, all.hit_tokens_ram + all.hit_tokens_ssd);
  EXPECT_GT(oracle.ssd_blocks_written, 0u);
  EXPECT_LT(oracle.ssd_blocks_written, all.ssd_blocks_written);
  EXPECT_EQ(oracle.ssd_blocks_read_back, oracle.ssd_blocks_written) << "no write is never read";
  EXPECT_LT(all.ssd_blocks_read_back, all.ssd_blocks_written);
  EXPECT_FALSE(replay(r.trace, {"chain-lru", "oracle:x", r.ram, r.ssd, r.dir->str()}).ok());
}

}  // namespace
}  // namespace kvtier::bench
