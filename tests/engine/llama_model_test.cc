// The engine's forward pass against the CPU reference, and both against golden tokens.
//
// Tolerance for logits, measured as |gpu - cpu| / (1 + |cpu|):
// - Arithmetic: both sides compute the same f32 operations, but RMSNorm and attention sum in
//   other orders and the GPU's exp differs by a few ulp. With F32 KV (nothing rounded) the worst
//   error over the golden prompts is 7.0e-5 on lavapipe; 2e-4 bounds it.
// - Storage: K and V are rounded to the KV dtype before they are cached. A K or V element whose
//   f32 value differs by one ulp between GPU and CPU and sits next to a rounding midpoint rounds
//   the other way: one ulp of the KV dtype (u = 2^-8 for BF16, 2^-11 for F16). Measured worst:
//   6.9e-3 = 1.8u for BF16 and 2.4e-3 = 5.0u for F16. 8u bounds both with margin.
// The greedy choices are tested exactly: their top-2 logit gap is at least 0.47 on these prompts.
#include <cstring>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "engine/blocks/block_transfer.h"
#include "engine/blocks/gpu_block_pool.h"
#include "engine/model/llama_model.h"
#include "engine/reference/reference_llama.h"
#include "tests/engine/engine_test_env.h"
#include "tests/engine/golden_prompts.h"

namespace kvtier {
namespace {

using testing::gpu;

struct GpuRun {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
};

// Plain generation on the engine: no cache, one sequence, blocks 0.. in order.
GpuRun generate_on_gpu(LlamaModel& model, GpuBlockPool& pool, const std::vector<int32_t>& prompt, int max_new) {
  const int bs = pool.layout().block_size;
  const int blocks = static_cast<int>((prompt.size() + max_new + bs - 1) / bs);
  auto alloc = pool.allocate(blocks);
  EXPECT_TRUE(alloc.ok());
  std::vector<int32_t> table = alloc->ids;
  GpuRun run;
  std::vector<int32_t> tokens = prompt;
  for (int step = 0; step < max_new; ++step) {
    ForwardBatch b;
    const size_t first = step == 0 ? 0 : tokens.size() - 1;
    for (size_t p = first; p < tokens.size(); ++p) {
      b.tokens.push_back(tokens[p]);
      b.positions.push_back(static_cast<int32_t>(p));
      b.slot_mapping.push_back(table[p / bs] * bs + static_cast<int32_t>(p % bs));
    }
    b.cu_seqlens_q = {0, static_cast<int32_t>(b.tokens.size())};
    b.seq_lens = {static_cast<int32_t>(tokens.size())};
    b.block_tables = table;
    b.max_blocks_per_seq = blocks;
    b.logit_rows = {static_cast<int32_t>(b.tokens.size()) - 1};
    auto logits = model.forward(b, pool);
    EXPECT_TRUE(logits.ok()) << logits.status().to_string();
    const int32_t next = static_cast<int32_t>(std::max_element(logits->begin(), logits->end()) - logits->begin());
    run.tokens.push_back(next);
    run.logits.push_back(std::move(logits).value());
    tokens.push_back(next);
  }
  for (int32_t id : table) pool.unref(id);
  return run;
}

// The build's source tree, else the same path relative to the working directory (a test binary
// carried to another machine runs in a copy of the repository).
nlohmann::json goldens() {
  std::ifstream in(KVTIER_GOLDEN_TOKENS);
  if (!in) in.open("tests/engine/golden_tokens.json");
  EXPECT_TRUE(in.good()) << "golden tokens not found";
  return nlohmann::json::parse(in);
}

// The CPU reference stores K/V in the cache's dtype as the GPU does; what is left is f32 rounding
// order (2e-4) and, per unit u of the KV dtype's rounding, a few u carried through the layers.
// On the tensor-core path, attention and every matmul also round their inputs to f16 (each kernel
// is held to its own bound in attention_test.cc and matmul_test.cc); over 29 matmuls and 4
// attention layers those roundings compound, and a score's error is amplified by |q||k| before
// exp: measured on the H100, worst 0.051 with F32 KV, 0.050 with F16, 0.098 with BF16 — while
// the greedy tokens equal the reference's in every case (checked exactly). The bound is twice
// the worst measured; the tokens are the sharp check there.
float logit_tolerance(DType kv, PagedAttentionVarlen::Path path) {
  if (path != PagedAttentionVarlen::Path::kScalar) return 0.2f;  // both tensor-core paths: f16 inputs
  const float u = kv == DType::kBF16 ? 0x1p-8f : kv == DType::kF16 ? 0x1p-11f : 0.0f;
  return 2e-4f + 8 * u;
}

// Greedy tokens equal the CPU reference's (and the goldens); logits within the path's bound.
void expect_model_matches_reference(DType dt, PagedAttentionVarlen::Path path) {
  SCOPED_TRACE(path == PagedAttentionVarlen::Path::kScalar ? "scalar path" : "tensor-core path");
  const LlamaConfig config = LlamaConfig::tiny();
  const LlamaWeights weights = LlamaWeights::synthetic(config);
  auto model = std::move(LlamaModel::create(gpu(), config, weights, path)).value();
  ASSERT_EQ(model->attention_path(dt, 16), path);
  auto pool = std::move(GpuBlockPool::create(gpu(), testing::share_layout(config.kv_layout(dt, 16)),
                                             {32, 0})).value();
  const nlohmann::json all = goldens();
  const nlohmann::json golden = all.value(std::string(dtype_name(dt)), nlohmann::json());
  const auto prompts = testing::golden_prompts();
  float worst = 0;
  for (size_t p = 0; p < prompts.size(); ++p) {
    reference::ReferenceLlama cpu(config, weights, dt);
    auto want = cpu.generate(prompts[p], testing::kGoldenNewTokens);
    auto got = generate_on_gpu(*model, *pool, prompts[p], testing::kGoldenNewTokens);
    EXPECT_EQ(got.tokens, want.tokens) << "GPU vs CPU reference, prompt " << p;
    if (!golden.is_null()) {
      EXPECT_EQ(want.tokens, golden[p].get<std::vector<int32_t>>()) << "CPU reference, prompt " << p;
    }
    for (size_t s = 0; s < got.logits.size() && s < want.logits.size(); ++s) {
      for (size_t i = 0; i < got.logits[s].size(); ++i) {
        const float err = std::fabs(got.logits[s][i] - want.logits[s][i]) / (1 + std::fabs(want.logits[s][i]));
        worst = std::max(worst, err);
      }
    }
  }
  EXPECT_LE(worst, logit_tolerance(dt, path));
  std::cout << "  worst logit error (relative to 1 + |logit|): " << worst << " (bound "
            << logit_tolerance(dt, path) << ")\n";
}

class LlamaModelTest : public ::testing::TestWithParam<DType> {};

TEST_P(LlamaModelTest, GpuLogitsMatchTheCpuReferenceAndTokensMatchTheGoldens) {
  for (PagedAttentionVarlen::Path path : testing::compute_paths()) expect_model_matches_reference(GetParam(), path);
}

// Every block's K/V bytes, all layers, gathered in block order; with `zero`, every block zeroed
// instead (so slots a run does not write compare equal).
std::vector<uint8_t> cache_bytes(GpuBlockPool& pool, bool zero = false) {
  auto transfer = BlockTransfer::create(gpu(), pool.layers());
  EXPECT_TRUE(transfer.ok()) << transfer.status().to_string();
  std::vector<int32_t> ids(pool.num_blocks());
  for (uint32_t i = 0; i < pool.num_blocks(); ++i) ids[i] = static_cast<int32_t>(i);
  GpuBuffer gids = testing::to_gpu(ids);
  GpuBuffer staging = testing::gpu_zeros(ids.size() * transfer->block_bytes());
  auto batch = std::move(CommandBatch::begin(gpu())).value();
  EXPECT_TRUE((zero ? transfer->record_scatter(batch, staging.address(), gids.address(), ids.size())
                    : transfer->record_gather(batch, gids.address(), ids.size(), staging.address()))
                  .ok());
  EXPECT_TRUE(batch.submit_and_wait().ok());
  return testing::from_gpu<uint8_t>(staging, ids.size() * transfer->block_bytes());
}

// RoPE and the cache write in one launch (rope_cache.comp) give the bits rope then
// reshape_and_cache give, and a forward whose first layer is submitted on its own gives the bits
// of one batch: the same logits through a prefill and decode steps, and the same bytes in every
// cache block (the blocks' slots, not just the logits they lead to).
TEST_P(LlamaModelTest, FusedLaunchesAndAFirstLayerSubmittedAloneGiveTheBitsOfOneUnfusedBatch) {
  const LlamaConfig config = LlamaConfig::tiny();
  ASSERT_EQ(config.head_dim % 8, 0) << "the fused launch needs 4-pair units";
  const LlamaWeights weights = LlamaWeights::synthetic(config);
  const auto prompt = testing::golden_prompts().back();
  for (PagedAttentionVarlen::Path path : testing::compute_paths()) {
    SCOPED_TRACE(PagedAttentionVarlen::path_name(path));
    std::vector<GpuRun> runs;
    std::vector<std::vector<uint8_t>> bytes;
    const std::pair<bool, bool> variants[] = {
        {true, true}, {false, false}, {true, false}, {false, true}};
    for (const auto& [fused, early] : variants) {
      auto model = std::move(LlamaModel::create(gpu(), config, weights, path)).value();
      model->set_fused_rope_cache(fused);
      model->set_early_submit(early);
      auto pool =
          std::move(GpuBlockPool::create(
                        gpu(), testing::share_layout(config.kv_layout(GetParam(), 16)), {16, 0}))
              .value();
      cache_bytes(*pool, /*zero=*/true);
      runs.push_back(generate_on_gpu(*model, *pool, prompt, 3));
      bytes.push_back(cache_bytes(*pool));
    }
    for (size_t v = 1; v < runs.size(); ++v) {
      SCOPED_TRACE("fused " + std::to_string(variants[v].first) + ", first layer alone " +
                   std::to_string(variants[v].second));
      EXPECT_EQ(runs[0].tokens, runs[v].tokens);
      ASSERT_EQ(runs[0].logits.size(), runs[v].logits.size());
      for (size_t s = 0; s < runs[0].logits.size(); ++s) {
        EXPECT_EQ(std::memcmp(runs[0].logits[s].data(), runs[v].logits[s].data(),
                              runs[0].logits[s].size() * 4),
                  0)
            << "step " << s;
      }
      EXPECT_TRUE(bytes[0] == bytes[v]) << "the cache's bytes differ";
    }
    EXPECT_NE(bytes[0], std::vector<uint8_t>(bytes[0].size(), 0)) << "nothing was written";
  }
}

// The logits' rows are normed and projected in one launch, gathered from wherever the batch puts
// them: rows asked for in any order, and twice, each give the bits of a forward that asks for
// that row alone. A row out of range is refused before anything runs.
TEST_P(LlamaModelTest, LogitRowsInAnyOrderEachGiveTheBitsOfThatRowAlone) {
  const LlamaConfig config = LlamaConfig::tiny();
  const LlamaWeights weights = LlamaWeights::synthetic(config);
  const auto prompt = testing::golden_prompts().back();
  const int n = static_cast<int>(prompt.size());
  ASSERT_GE(n, 8);
  for (PagedAttentionVarlen::Path path : testing::compute_paths()) {
    SCOPED_TRACE(PagedAttentionVarlen::path_name(path));
    auto model = std::move(LlamaModel::create(gpu(), config, weights, path)).value();
    auto pool =
        std::move(GpuBlockPool::create(
                      gpu(), testing::share_layout(config.kv_layout(GetParam(), 16)), {16, 0}))
            .value();
    const int blocks = (n + 15) / 16;
    auto alloc = pool->allocate(blocks);
    ASSERT_TRUE(alloc.ok());
    ForwardBatch b;
    for (int p = 0; p < n; ++p) {
      b.tokens.push_back(prompt[p]);
      b.positions.push_back(p);
      b.slot_mapping.push_back(alloc->ids[p / 16] * 16 + p % 16);
    }
    b.cu_seqlens_q = {0, n};
    b.seq_lens = {n};
    b.block_tables = alloc->ids;
    b.max_blocks_per_seq = blocks;
    const std::vector<int32_t> asked = {n - 1, 0, 7, n - 1, 3};
    b.logit_rows = asked;
    auto all = model->forward(b, *pool);
    ASSERT_TRUE(all.ok()) << all.status().to_string();
    const size_t vocab = static_cast<size_t>(config.vocab);
    ASSERT_EQ(all->size(), asked.size() * vocab);
    for (size_t i = 0; i < asked.size(); ++i) {
      b.logit_rows = {asked[i]};
      auto alone = model->forward(b, *pool);
      ASSERT_TRUE(alone.ok()) << alone.status().to_string();
      EXPECT_EQ(std::memcmp(alone->data(), all->data() + i * vocab, vocab * 4), 0)
          << "row " << asked[i] << " at index " << i;
    }
    EXPECT_NE(std::memcmp(all->data(), all->data() + vocab, vocab * 4), 0)
        << "rows n - 1 and 0 gave the same logits: the rows were not gathered";
    for (int32_t bad : {-1, n}) {
      b.logit_rows = {0, bad};
      auto refused = model->forward(b, *pool);
      ASSERT_FALSE(refused.ok());
      EXPECT_NE(refused.status().to_string().find("logit row out of range"), std::string::npos);
    }
    for (int32_t id : alloc->ids) pool->unref(id);
  }
}

INSTANTIATE_TEST_SUITE_P(KvDtypes, LlamaModelTest, ::testing::Values(DType::kBF16, DType::kF16, DType::kF32),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace kvtier
