// The contract for hybrid models (issue 35): a prefix restored from the cache — the attention
// layers' KV blocks and the GDN layers' state snapshot — gives the logits of computing it, bit for
// bit: from the GPU, RAM, the SSD, the SSD after a restart, batched with other sequences, and on
// the next turn of a conversation. The tiny hybrid model (tiny_hybrid: 6 GDN + 2 attention layers)
// on the Vulkan engine; every logit of every step is compared as bytes.
#include <cstring>

#include <gtest/gtest.h>

#include "cache/cache_stack.h"
#include "generate/hybrid_generator.h"
#include "serialize/state_record.h"
#include "tests/generate/parity_support.h"
#include "tests/engine/engine_test_env.h"
#include "tests/support/redis_servers.h"
#include "tests/support/temp_dir.h"

namespace kvtier {
namespace {

using testing::expect_bit_identical;
using testing::gpu;
using testing::tokens_from;

constexpr int kBlockSize = 16;
constexpr int kNewTokens = 4;

// A: 70 tokens (4 full blocks). B: A's first 4 blocks, then 20 tokens of its own.
const std::vector<int32_t> kPromptA = tokens_from(1, 70);
const std::vector<int32_t> kPromptB = [] {
  std::vector<int32_t> b(kPromptA.begin(), kPromptA.begin() + 4 * kBlockSize);
  for (int32_t t : tokens_from(2, 20)) b.push_back(t);
  return b;
}();

const LlamaConfig& config() {
  static const LlamaConfig c = LlamaConfig::tiny_hybrid();
  return c;
}

LlamaModel& model() {
  static std::unique_ptr<LlamaModel> m =
      std::move(LlamaModel::create(gpu(), config(), LlamaWeights::synthetic(config()))).value();
  return *m;
}

struct StackOptions {
  uint32_t gpu_blocks = 32;
  uint64_t ram_bytes = 64 << 20;
  std::string ssd_dir;  // empty: no SSD tier
  size_t snapshot_every_blocks = 0;
  std::string redis_url;  // set: a remote tier on it, at the bottom
};

struct Stack {
  HybridLayout hybrid = std::move(config().hybrid_layout(DType::kBF16, kBlockSize)).value();
  std::unique_ptr<CacheStack> tiers;
  std::unique_ptr<HybridPrefixCache> cache;
  std::unique_ptr<GdnStatePool> states;
  std::unique_ptr<HybridGenerator> gen;

  explicit Stack(const StackOptions& o) {
    CacheStackOptions co;
    co.layout = testing::share_layout(config().kv_layout(DType::kBF16, kBlockSize));
    co.vulkan = &gpu();
    co.gpu_pool.num_blocks = o.gpu_blocks;
    co.ram.capacity_bytes = o.ram_bytes;
    if (!o.ssd_dir.empty()) {
      co.ssd.emplace();
      co.ssd->dir = o.ssd_dir;
      co.ssd->segment_size = 4 << 20;
      co.ssd->capacity_bytes = 64 << 20;
    }
    if (!o.redis_url.empty()) {
      co.remote.emplace();
      co.remote->address = std::move(RedisAddress::parse(o.redis_url)).value();
      co.remote->key_prefix = "hybrid-parity:";
    }
    tiers = std::move(CacheStack::open(co)).value();
    cache = std::move(HybridPrefixCache::create(tiers->cache(), hasher(), hybrid, tiers->layouts())).value();
    states = std::move(GdnStatePool::create(gpu(), config().gdn, config().gdn_layers(), 4)).value();
    gen = std::make_unique<HybridGenerator>(model(), *tiers->gpu(), *states, *cache,
                                            HybridGeneratorOptions{o.snapshot_every_blocks});
  }
  ~Stack() {
    gen.reset();
    cache.reset();  // stops listening before the tiers close
  }

  PrefixHasher hasher() const {
    return PrefixHasher(HashAlgorithm::kSha256, Namespace{"hybrid-parity", hybrid.fingerprint(), ""}, kBlockSize);
  }
  std::vector<BlockKey> keys(const std::vector<uint32_t>& tokens) const { return hasher().keys(tokens, {}); }

  Generation run(const std::vector<int32_t>& prompt, bool use_cache = true) {
    auto g = gen->generate(prompt, kNewTokens, use_cache);
    EXPECT_TRUE(g.ok()) << g.status().to_string();
    return g.ok() ? std::move(g).value() : Generation{};
  }
};

// The reference: computed from scratch, nothing stored.
Generation reference(const std::vector<int32_t>& prompt) {
  Stack s({});
  return s.run(prompt, false);
}

TEST(HybridParityTest, PrefixRestoredFromGpuAndRamEqualsRecomputed) {
  const Generation want_a = reference(kPromptA), want_b = reference(kPromptB);
  Stack s({});
  const Generation cold = s.run(kPromptA);
  EXPECT_EQ(cold.cached_tokens, 0u);
  expect_bit_identical(cold, want_a, "A, computed in pieces that end at its snapshots");
  EXPECT_GE(s.cache->metrics().snapshots_stored.value(), 1u);

  // B shares A's 4 blocks; A's snapshot after its 4th block makes all of them restorable.
  const Generation b = s.run(kPromptB);
  EXPECT_EQ(b.cached_tokens, 64u);
  EXPECT_EQ(b.restored_blocks_by_tier[0], 4u);
  expect_bit_identical(b, want_b, "B, 4 blocks and a snapshot restored on the GPU");

  // B's own run stored its 5th block and the snapshot after it: all 5 come back from RAM now.
  ASSERT_TRUE(s.tiers->evict_gpu().ok());
  const Generation b_ram = s.run(kPromptB);
  EXPECT_EQ(b_ram.cached_tokens, 80u);
  EXPECT_EQ(b_ram.restored_blocks_by_tier[1], 5u);
  expect_bit_identical(b_ram, want_b, "B, 5 blocks and a snapshot restored from RAM");
}

TEST(HybridParityTest, PrefixRestoredFromSsdAfterARestartEqualsRecomputed) {
  const Generation want_b = reference(kPromptB);
  testing::TempDir dir;
  {
    Stack s({32, 64 << 20, dir.str(), 0, ""});
    s.run(kPromptA);
    ASSERT_TRUE(s.tiers->evict_gpu().ok());
    const auto persisted = s.tiers->persist_to_ssd(std::chrono::steady_clock::now() + std::chrono::seconds(30));
    EXPECT_EQ(persisted.not_kept(), 0u);
  }  // the process ends: the SSD writer drains
  Stack s({32, 64 << 20, dir.str(), 0, ""});
  const Generation b = s.run(kPromptB);
  EXPECT_EQ(b.cached_tokens, 64u);
  EXPECT_EQ(b.restored_blocks_by_tier[2], 4u);
  expect_bit_identical(b, want_b, "B, 4 blocks and a snapshot read from the SSD after a restart");
  EXPECT_EQ(s.cache->metrics().snapshot_reads.value(), 1u);
  EXPECT_EQ(s.cache->metrics().snapshot_read_failures.value(), 0u);
}

// Two hosts sharing a Redis: one computes A (its blocks reach Redis as they leave its GPU, its
// snapshot as it is stored); the other, with nothing of its own, restores B's prefix from Redis.
TEST(HybridParityTest, PrefixRestoredFromRedisOnAnotherHostEqualsRecomputed) {
  const Generation want_b = reference(kPromptB);
  testing::TempDir dir;
  std::string error;
  auto redis = testing::RedisServers::standalone(dir.str(), {}, &error);
  ASSERT_TRUE(redis) << error;
  const std::string url = "redis://127.0.0.1:" + std::to_string(redis->ports().front());
  {
    Stack a({32, 64 << 20, "", 0, url});
    a.run(kPromptA);
    ASSERT_TRUE(a.tiers->evict_gpu().ok());
    a.tiers->remote()->flush();
  }
  Stack b_host({32, 64 << 20, "", 0, url});
  const Generation b = b_host.run(kPromptB);
  EXPECT_EQ(b.cached_tokens, 64u);
  EXPECT_EQ(b.restored_blocks_by_tier[2], 4u);
  expect_bit_identical(b, want_b, "B, 4 blocks and a snapshot read from Redis by another host");
  EXPECT_EQ(b_host.cache->metrics().snapshot_reads.value(), 1u);
}

TEST(HybridParityTest, WithoutItsSnapshotAPrefixIsComputedAndStillExact) {
  const Generation want_b = reference(kPromptB);
  Stack s({});
  s.run(kPromptA);
  // A's snapshot is gone: its KV blocks alone restore nothing.
  const std::vector<uint32_t> a(kPromptA.begin(), kPromptA.end());
  const auto keys = s.keys(a);
  ASSERT_TRUE(*s.tiers->cache().erase(s.hasher().snapshot_key(keys[3].hash)));
  const Generation b = s.run(kPromptB);
  EXPECT_EQ(b.cached_tokens, 0u);
  expect_bit_identical(b, want_b, "B computed: no snapshot");
  EXPECT_GE(s.cache->metrics().lookups_kv_without_snapshot.value(), 1u);
}

// A prompt of whole blocks sent again: its snapshot was taken at its last block end before its
// last token (at least one token is computed for the logits), so 3 of its 4 blocks come back.
TEST(HybridParityTest, AWholeBlockPromptSentAgainRestoresAllButItsLastBlock) {
  const std::vector<int32_t> prompt(kPromptA.begin(), kPromptA.begin() + 4 * kBlockSize);
  const Generation want = reference(prompt);
  Stack s({});
  s.run(prompt);
  const Generation again = s.run(prompt);
  EXPECT_EQ(again.cached_tokens, 48u);
  expect_bit_identical(again, want, "the same 64 tokens, 3 blocks and a snapshot restored");
}

TEST(HybridParityTest, EveryNBlocksRestoresUpToTheLastSnapshotBeforeADivergence) {
  // C shares A's first 3 blocks only; with a snapshot every 2 blocks, 2 of them are restorable.
  std::vector<int32_t> c(kPromptA.begin(), kPromptA.begin() + 3 * kBlockSize);
  for (int32_t t : tokens_from(3, 30)) c.push_back(t);
  const Generation want_c = reference(c);
  Stack s({32, 64 << 20, "", 2, ""});
  s.run(kPromptA);
  const Generation got = s.run(c);
  EXPECT_EQ(got.cached_tokens, 32u);
  expect_bit_identical(got, want_c, "C, 2 blocks and the snapshot after them");
}

TEST(HybridParityTest, BatchedAndNextTurnEqualEachAlone) {
  // The next turn: a 62-token prompt, its answer, and a new question. The prompt's snapshot is
  // after block 3. Block 4, which the prompt's last rows and decode steps filled (tokens 48-63),
  // is not published: its GDN state is the token-by-token form's, and the next turn's prefill
  // computes those tokens as a whole chunk.
  const std::vector<int32_t> prompt(kPromptA.begin(), kPromptA.begin() + 62);
  Stack s({});
  const Generation first = s.run(prompt);
  std::vector<int32_t> turn = prompt;
  turn.insert(turn.end(), first.tokens.begin(), first.tokens.end() - 1);  // the fed ones: 65 tokens
  for (int32_t t : tokens_from(4, 12)) turn.push_back(t);
  const Generation want_turn = reference(turn), want_other = reference(tokens_from(5, 40));
  auto both = s.gen->generate_batch({turn, tokens_from(5, 40)}, kNewTokens);
  ASSERT_TRUE(both.ok()) << both.status().to_string();
  EXPECT_EQ((*both)[0].cached_tokens, 48u);
  expect_bit_identical((*both)[0], want_turn, "the next turn, batched with a cold prompt");
  expect_bit_identical((*both)[1], want_other, "a cold prompt batched with a restored one");
}

}  // namespace
}  // namespace kvtier
