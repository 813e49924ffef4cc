// The attention tests' problem: paged K/V of a dtype and shape with random values, queries, and
// the launches that run it (the CPU reference, decode, varlen), shared by attention_test.cc and
// attention_staging_test.cc.
#pragma once

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "engine/attention/paged_attention.h"
#include "engine/reference/reference_attention.h"
#include "tests/engine/engine_test_env.h"
#include "tests/support/test_blocks.h"

namespace kvtier::testing {

struct AttnCase {
  const char* name;
  DType dtype;
  int head_dim;
  int gqa;
  int kv_heads;
  int block_size;
  std::vector<int> lens;
  float softcap = 0;
  int window = 0;
};

// A paged cache with every sequence's blocks scattered at random over the arrays.
struct PagedProblem {
  explicit PagedProblem(const AttnCase& c, const std::vector<int>& q_lens) {
    num_heads = c.gqa * c.kv_heads;
    for (int len : c.lens)
      max_blocks = std::max(max_blocks, (len + c.block_size - 1) / c.block_size);
    const int blocks = max_blocks * static_cast<int>(c.lens.size()) + 3;
    const size_t elems = static_cast<size_t>(blocks) * c.block_size * c.kv_heads * c.head_dim;
    k.resize(elems * dtype_size(c.dtype));
    v.resize(k.size());
    std::mt19937_64 rng(c.head_dim * 31 + c.gqa);
    testing::fill_tensor(c.dtype, k, rng, testing::Values::kRandom, c.head_dim);
    testing::fill_tensor(c.dtype, v, rng, testing::Values::kRandom, c.head_dim);
    std::vector<int32_t> perm(blocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    tables.assign(c.lens.size() * max_blocks, 0);
    for (size_t s = 0; s < c.lens.size(); ++s) {
      for (int b = 0; b < max_blocks; ++b) tables[s * max_blocks + b] = perm[s * max_blocks + b];
    }
    lens.assign(c.lens.begin(), c.lens.end());
    cu.push_back(0);
    for (int ql : q_lens) cu.push_back(cu.back() + ql);
    q = testing::random_floats(static_cast<size_t>(cu.back()) * num_heads * c.head_dim, 77, -0.5f,
                               0.5f);
    options.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    options.softcap = c.softcap;
    options.window = c.window;
    gk = to_gpu(k);
    gv = to_gpu(v);
    gtables = to_gpu(tables);
    glens = to_gpu(lens);
    gcu = to_gpu(cu);
    gq = to_gpu(q);
    view = {gk.address(),
            gv.address(),
            static_cast<uint32_t>(blocks),
            static_cast<uint32_t>(c.block_size),
            static_cast<uint32_t>(c.kv_heads),
            static_cast<uint32_t>(c.head_dim),
            c.dtype};
  }
  std::vector<float> reference(const AttnCase& c) const {
    std::vector<float> out(q.size());
    reference::paged_attention({k.data(), v.data(), c.dtype, c.block_size, c.kv_heads, c.head_dim},
                               options, q, num_heads, tables, max_blocks, lens, cu, out);
    return out;
  }
  // Every sequence's decode row, in one launch (or `launches` launches in one batch, each over
  // the same inputs, with `kernel` kept across calls when given). With `only` set, just that
  // sequence, as a batch of one.
  std::vector<float> decode(std::optional<size_t> only = std::nullopt, int launches = 1,
                            PagedAttentionDecode* kernel = nullptr) {
    const size_t row = static_cast<size_t>(num_heads) * view.head_dim;
    const size_t first = only.value_or(0), count = only ? 1 : lens.size();
    GpuBuffer out = testing::gpu_zeros(count * row * 4);
    PagedAttentionDecode own(gpu());
    PagedAttentionDecode& k = kernel ? *kernel : own;
    DecodeBatch b{gq.address() + first * row * 4,
                  out.address(),
                  gtables.address() + first * max_blocks * 4,
                  static_cast<uint32_t>(max_blocks),
                  glens.address() + first * 4,
                  static_cast<uint32_t>(count),
                  static_cast<uint32_t>(
                      *std::max_element(lens.begin() + first, lens.begin() + first + count)),
                  static_cast<uint32_t>(num_heads)};
    auto batch = std::move(CommandBatch::begin(gpu())).value();
    for (int i = 0; i < launches; ++i) {
      Status st = k.record(batch, b, view, options);
      EXPECT_TRUE(st.ok()) << st.to_string();
    }
    EXPECT_TRUE(batch.submit_and_wait().ok());
    return from_gpu<float>(out, count * row);
  }
  std::vector<float> varlen(
      PagedAttentionVarlen::SplitPolicy policy = PagedAttentionVarlen::SplitPolicy::kAuto,
      PagedAttentionVarlen::Path path = PagedAttentionVarlen::Path::kScalar,
      bool half_staging = true) {
    GpuBuffer out = testing::gpu_zeros(q.size() * 4);
    PagedAttentionVarlen k(gpu(), policy, path);
    k.set_half_staging(half_staging);
    EXPECT_EQ(k.path(view, static_cast<uint32_t>(num_heads)), path)
        << "this shape cannot take the path under test";
    auto batch = std::move(CommandBatch::begin(gpu())).value();
    Status st = k.record(batch, batch_view(out.address()), view, options);
    EXPECT_TRUE(st.ok()) << st.to_string();
    EXPECT_TRUE(batch.submit_and_wait().ok());
    return from_gpu<float>(out, q.size());
  }

  VarlenBatch batch_view(uint64_t out) const {
    return VarlenBatch{gq.address(),
                       out,
                       gtables.address(),
                       static_cast<uint32_t>(max_blocks),
                       glens.address(),
                       gcu.address(),
                       cu,
                       static_cast<uint32_t>(num_heads),
                       static_cast<uint32_t>(*std::max_element(lens.begin(), lens.end()))};
  }

  int num_heads = 0, max_blocks = 0;
  std::vector<uint8_t> k, v;
  std::vector<int32_t> tables, lens, cu;
  std::vector<float> q;
  AttentionOptions options;
  GpuBuffer gk, gv, gtables, glens, gcu, gq;
  PagedKvView view;
};

}  // namespace kvtier::testing
