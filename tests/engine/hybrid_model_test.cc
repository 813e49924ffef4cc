// The hybrid tiny model (Gated DeltaNet layers beside attention, issue 35) on the engine: its GDN
// layers continue from the state their sequence left, so a prompt computed in pieces, or resumed
// in another slot from a downloaded snapshot, gives the one-launch logits bit for bit; rows do not
// depend on what shares their launch; and the state matters (a lost one changes the logits).
#include <cmath>
#include <cstring>
#include <iostream>
#include <vector>

#include <gtest/gtest.h>

#include "engine/blocks/gpu_block_pool.h"
#include "engine/model/llama_model.h"
#include "tests/engine/engine_test_env.h"

namespace kvtier {
namespace {

using testing::gpu;

constexpr int kBlock = 16;

struct Hybrid {
  LlamaConfig config = LlamaConfig::tiny_hybrid();
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<GpuBlockPool> pool;
  std::unique_ptr<GdnStatePool> states;
  Hybrid() {
    model = std::move(LlamaModel::create(gpu(), config, LlamaWeights::synthetic(config))).value();
    pool = std::move(GpuBlockPool::create(gpu(), testing::share_layout(config.kv_layout(DType::kBF16, kBlock)),
                                          {64, 0}))
               .value();
    states = std::move(GdnStatePool::create(gpu(), config.gdn, config.gdn_layers(), 4)).value();
  }
};

std::vector<int32_t> prompt(size_t n, int seed) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>((i * 37 + seed * 101 + 5) % 512);
  return t;
}

// One sequence's rows [from, to) of `tokens` over `table`, continuing from state slot `slot`;
// the last row's logits.
struct Piece {
  const std::vector<int32_t>* tokens;
  size_t from, to;
  std::vector<int32_t> table;
  int32_t slot;
};

std::vector<float> run(Hybrid& h, const std::vector<Piece>& pieces) {
  ForwardBatch b;
  b.cu_seqlens_q = {0};
  int32_t max_blocks = 0;
  for (const Piece& p : pieces) max_blocks = std::max<int32_t>(max_blocks, static_cast<int32_t>(p.table.size()));
  b.max_blocks_per_seq = max_blocks;
  for (const Piece& p : pieces) {
    for (size_t pos = p.from; pos < p.to; ++pos) {
      b.tokens.push_back((*p.tokens)[pos]);
      b.positions.push_back(static_cast<int32_t>(pos));
      b.slot_mapping.push_back(p.table[pos / kBlock] * kBlock + static_cast<int32_t>(pos % kBlock));
    }
    b.cu_seqlens_q.push_back(static_cast<int32_t>(b.tokens.size()));
    b.seq_lens.push_back(static_cast<int32_t>(p.to));
    std::vector<int32_t> row = p.table;
    row.resize(max_blocks, 0);
    b.block_tables.insert(b.block_tables.end(), row.begin(), row.end());
    b.logit_rows.push_back(static_cast<int32_t>(b.tokens.size()) - 1);
    b.state_slots.push_back(p.slot);
  }
  auto logits = h.model->forward(b, *h.pool, h.states.get());
  EXPECT_TRUE(logits.ok()) << logits.status().to_string();
  return logits.ok() ? std::move(logits).value() : std::vector<float>();
}

std::vector<int32_t> blocks(Hybrid& h, size_t tokens) {
  return std::move(h.pool->allocate(static_cast<uint32_t>((tokens + kBlock - 1) / kBlock))).value().ids;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && !a.empty() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

TEST(HybridModelTest, ItsShapeIsTheQwen35PatternScaledDown) {
  const LlamaConfig c = LlamaConfig::tiny_hybrid();
  EXPECT_EQ(c.num_layers, 8);
  EXPECT_EQ(c.gdn_layers(), 6);
  EXPECT_EQ(c.attention_layers(), 2);
  EXPECT_EQ(c.kv_layout(DType::kBF16, 16).num_layers, 2);
  auto layout = c.hybrid_layout(DType::kBF16, 16);
  ASSERT_TRUE(layout.ok()) << layout.status().to_string();
  EXPECT_EQ(layout->attention().fingerprint(), c.kv_layout(DType::kBF16, 16).fingerprint());
  // 6 layers x (4 heads x 64 x 64 + 768 channels x 3) f32.
  EXPECT_EQ(layout->snapshot_bytes(), 6u * (4 * 64 * 64 + 768 * 3) * 4);
}

TEST(HybridModelTest, APromptInPiecesGivesTheOneLaunchLogitsBitForBit) {
  Hybrid h;
  const auto tokens = prompt(75, 1);
  const auto table = blocks(h, tokens.size());
  ASSERT_TRUE(h.states->reset(0).ok());
  const std::vector<float> whole = run(h, {{&tokens, 0, 75, table, 0}});
  for (float x : whole) ASSERT_TRUE(std::isfinite(x));
  ASSERT_TRUE(h.states->reset(0).ok());
  run(h, {{&tokens, 0, 32, table, 0}});
  run(h, {{&tokens, 32, 48, table, 0}});
  EXPECT_TRUE(same_bits(run(h, {{&tokens, 48, 75, table, 0}}), whole));
}

TEST(HybridModelTest, WholeChunksOfAPromptTakeTheChunkForm) {
  // 48 tokens in one forward (three whole chunks) against the same tokens one forward each (every
  // row token by token): the same rule in another order of sums, so the logits are close and not
  // the same bits, which they would be were the chunk form not taken. Each GDN layer's outputs
  // agree within ~1e-7 (GatedDeltaKernelTest), but the layers after read them rounded (f16 matmul
  // inputs, bf16 K/V), where such a difference flips a rounding now and then — up to 2^-8 of a
  // K/V value — and the layers carry it on. Measured: 1.1e-4 of the largest logit on lavapipe,
  // 1.4e-3 on the H200. The bound, 2^-8 of it, is still tight enough to fail: the same tokens
  // with the GDN state lost after 32 of them move the logits past it.
  Hybrid h;
  const auto tokens = prompt(48, 6);
  const auto table = blocks(h, tokens.size());
  ASSERT_TRUE(h.states->reset(0).ok());
  const std::vector<float> chunks = run(h, {{&tokens, 0, 48, table, 0}});
  ASSERT_TRUE(h.states->reset(1).ok());
  std::vector<float> steps;
  for (size_t pos = 0; pos < 48; ++pos) steps = run(h, {{&tokens, pos, pos + 1, table, 1}});
  ASSERT_TRUE(h.states->reset(2).ok());
  run(h, {{&tokens, 0, 32, table, 2}});
  ASSERT_TRUE(h.states->reset(2).ok());
  const std::vector<float> lost = run(h, {{&tokens, 32, 48, table, 2}});
  ASSERT_EQ(steps.size(), chunks.size());
  ASSERT_EQ(lost.size(), chunks.size());
  EXPECT_FALSE(same_bits(steps, chunks));
  float worst = 0, lost_worst = 0, largest = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    worst = std::max(worst, std::abs(steps[i] - chunks[i]));
    lost_worst = std::max(lost_worst, std::abs(lost[i] - chunks[i]));
    largest = std::max(largest, std::abs(chunks[i]));
  }
  std::cout << "  chunk form against token by token: logits differ by at most " << worst
            << ", with the state lost " << lost_worst << " (largest " << largest << ")\n";
  EXPECT_LT(worst, largest / 256);
  EXPECT_GT(lost_worst, largest / 256);
}

TEST(HybridModelTest, ASnapshotResumedInAnotherSlotGivesTheSameLogits) {
  Hybrid h;
  const auto tokens = prompt(70, 2);
  const auto table = blocks(h, tokens.size());
  ASSERT_TRUE(h.states->reset(0).ok());
  const std::vector<float> whole = run(h, {{&tokens, 0, 70, table, 0}});

  ASSERT_TRUE(h.states->reset(1).ok());
  run(h, {{&tokens, 0, 48, table, 1}});
  std::vector<uint8_t> snapshot(h.states->snapshot_bytes());
  ASSERT_TRUE(h.states->download(1, snapshot).ok());
  // Slot 1 goes on with another prompt; slot 2 resumes from the snapshot and the KV blocks.
  const auto other = prompt(40, 3);
  ASSERT_TRUE(h.states->reset(1).ok());
  run(h, {{&other, 0, 40, blocks(h, 40), 1}});
  ASSERT_TRUE(h.states->upload(2, snapshot).ok());
  EXPECT_TRUE(same_bits(run(h, {{&tokens, 48, 70, table, 2}}), whole));

  // Without the state (a fresh slot over the same KV blocks) the logits differ: the GDN layers'
  // state carries the prefix, so a test of it can fail.
  ASSERT_TRUE(h.states->reset(3).ok());
  EXPECT_FALSE(same_bits(run(h, {{&tokens, 48, 70, table, 3}}), whole));
}

TEST(HybridModelTest, RowsDoNotDependOnWhatSharesTheirLaunch) {
  Hybrid h;
  const auto a = prompt(50, 4), b = prompt(33, 5);
  const auto ta = blocks(h, a.size()), tb = blocks(h, b.size());
  ASSERT_TRUE(h.states->reset(0).ok());
  const std::vector<float> alone_a = run(h, {{&a, 0, 50, ta, 0}});
  ASSERT_TRUE(h.states->reset(1).ok());
  const std::vector<float> alone_b = run(h, {{&b, 0, 33, tb, 1}});
  ASSERT_TRUE(h.states->reset(0).ok());
  ASSERT_TRUE(h.states->reset(1).ok());
  const std::vector<float> both = run(h, {{&a, 0, 50, ta, 0}, {&b, 0, 33, tb, 1}});
  const size_t vocab = h.config.vocab;
  EXPECT_TRUE(same_bits({both.begin(), both.begin() + vocab}, alone_a));
  EXPECT_TRUE(same_bits({both.begin() + vocab, both.end()}, alone_b));
}

TEST(HybridModelTest, BadStateArgumentsAreRefused) {
  Hybrid h;
  const auto tokens = prompt(20, 6);
  ForwardBatch b;
  b.tokens = {tokens[0]};
  b.positions = {0};
  const auto table = blocks(h, 1);
  b.slot_mapping = {table[0] * kBlock};
  b.cu_seqlens_q = {0, 1};
  b.seq_lens = {1};
  b.block_tables = table;
  b.max_blocks_per_seq = 1;
  b.logit_rows = {0};
  EXPECT_EQ(h.model->forward(b, *h.pool, h.states.get()).status().code(), StatusCode::kInvalidArgument);  // no slot
  b.state_slots = {9};
  EXPECT_EQ(h.model->forward(b, *h.pool, h.states.get()).status().code(), StatusCode::kInvalidArgument);
  b.state_slots = {0};
  EXPECT_EQ(h.model->forward(b, *h.pool, nullptr).status().code(), StatusCode::kInvalidArgument);
  std::vector<uint8_t> small(16);
  EXPECT_EQ(h.states->upload(0, small).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(h.model->forward(b, *h.pool, h.states.get()).ok());
}

}  // namespace
}  // namespace kvtier
