// KvHalfStaging: each sequence's context blocks, wherever the block table scatters them, copied
// as f16 in table order, with an identity block table: f16 as it is, bf16 and f32 clamped to
// f16's range (+-65504) and rounded to nearest even (bf16 inside the range converts exactly). Compared byte for byte with
// the CPU's conversion; values in f16's subnormal range are left out (the device's conversion
// may flush them, the attention kernel's does the same, and the H100's varlen test compares the
// two).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

#include "engine/attention/kv_half_staging.h"
#include "tests/engine/engine_test_env.h"

namespace kvtier {
namespace {

using testing::from_gpu;
using testing::gpu;
using testing::to_gpu;

constexpr uint32_t kBlockSize = 16, kKvHeads = 2, kHeadDim = 64;
constexpr uint32_t kBlockElems = kBlockSize * kKvHeads * kHeadDim;

// A value the kernel sees as f32: random in [-8, 8), now and then one beyond f16's range.
float sample(std::mt19937_64& rng) {
  std::uniform_real_distribution<float> d(-8.0f, 8.0f);
  switch (rng() % 16) {
    case 0: return 70000.0f;
    case 1: return -1e30f;
    case 2: return 65504.0f;
    case 3: return 0.0f;
    default: return d(rng);
  }
}

// What the staging holds for a stored value: an f16 word stays as it is (expected_half of its
// exact value gives it back: it is inside the range).
uint16_t expected_half(float f) { return f32_to_f16(std::clamp(f, -65504.0f, 65504.0f)); }

void check_staging(DType dtype) {
  SCOPED_TRACE(std::string(dtype_name(dtype)));
  const std::vector<int32_t> lens{37, 70};  // 3 and 5 blocks: a partial last block each
  const uint32_t max_blocks = 5, pool_blocks = 12;
  std::mt19937_64 rng(11);
  std::vector<float> kf(size_t{pool_blocks} * kBlockElems), vf(kf.size());
  for (float& x : kf) x = sample(rng);
  for (float& x : vf) x = sample(rng);
  // As stored: bf16 words (rounded from the samples) or the f32 values themselves.
  auto stored = [&](const std::vector<float>& src, std::vector<float>& as_seen) {
    std::vector<uint8_t> bytes(src.size() * dtype_size(dtype));
    as_seen.resize(src.size());
    for (size_t i = 0; i < src.size(); ++i) {
      if (dtype == DType::kF16) {
        const uint16_t w = f32_to_f16(std::clamp(src[i], -65504.0f, 65504.0f));
        std::memcpy(bytes.data() + 2 * i, &w, 2);
        as_seen[i] = f16_to_f32(w);
      } else if (dtype == DType::kBF16) {
        const uint16_t w = f32_to_bf16(src[i]);
        std::memcpy(bytes.data() + 2 * i, &w, 2);
        as_seen[i] = bf16_to_f32(w);
      } else {
        std::memcpy(bytes.data() + 4 * i, &src[i], 4);
        as_seen[i] = src[i];
      }
    }
    return bytes;
  };
  std::vector<float> k_seen, v_seen;
  GpuBuffer gk = to_gpu(stored(kf, k_seen)), gv = to_gpu(stored(vf, v_seen));
  std::vector<int32_t> perm(pool_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> tables(lens.size() * max_blocks);
  std::copy_n(perm.begin(), tables.size(), tables.begin());
  GpuBuffer gtables = to_gpu(tables), glens = to_gpu(lens);
  const PagedKvView view{gk.address(), gv.address(), pool_blocks, kBlockSize, kKvHeads, kHeadDim, dtype};

  KvHalfStaging staging(gpu());
  auto batch = std::move(CommandBatch::begin(gpu())).value();
  auto staged = staging.record(batch, view, gtables.address(), glens.address(), 2, max_blocks);
  ASSERT_TRUE(staged.ok()) << staged.status().to_string();
  ASSERT_TRUE(batch.submit_and_wait().ok());
  EXPECT_EQ(staged->cache.dtype, DType::kF16);
  EXPECT_EQ(staged->cache.num_blocks, 2 * max_blocks);
  EXPECT_EQ(staged->cache.head_dim, kHeadDim);

  const auto all = from_gpu<uint16_t>(*staging.buffer(), staging.buffer()->size() / 2);
  const uint64_t base = staging.buffer()->address();
  auto at = [&](uint64_t address) { return (address - base) / 2; };  // in 16-bit words
  std::vector<int32_t> table_back(tables.size());
  std::memcpy(table_back.data(), all.data() + at(staged->block_tables), table_back.size() * 4);
  for (size_t i = 0; i < table_back.size(); ++i) EXPECT_EQ(table_back[i], static_cast<int32_t>(i));

  size_t mismatches = 0;
  for (size_t s = 0; s < lens.size(); ++s) {
    const uint32_t used = (lens[s] + kBlockSize - 1) / kBlockSize;
    for (uint32_t j = 0; j < used; ++j) {
      const size_t slot = s * max_blocks + j, src = static_cast<size_t>(tables[slot]) * kBlockElems;
      for (uint32_t e = 0; e < kBlockElems; ++e) {
        mismatches += all[at(staged->cache.k) + slot * kBlockElems + e] != expected_half(k_seen[src + e]);
        mismatches += all[at(staged->cache.v) + slot * kBlockElems + e] != expected_half(v_seen[src + e]);
      }
    }
  }
  EXPECT_EQ(mismatches, 0u);
}

TEST(KvHalfStagingTest, CopiesEachSequencesBlocksInTableOrderAsF16) {
  check_staging(DType::kBF16);
  check_staging(DType::kF32);
  check_staging(DType::kF16);
}

TEST(KvHalfStagingTest, RefusesWhatItCannotStage) {
  GpuBuffer none = testing::gpu_zeros(64);
  KvHalfStaging staging(gpu());
  auto batch = std::move(CommandBatch::begin(gpu())).value();
  PagedKvView bf16{none.address(), none.address(), 1, kBlockSize, kKvHeads, kHeadDim, DType::kU8};
  EXPECT_FALSE(staging.record(batch, bf16, none.address(), none.address(), 1, 1).ok());  // not a KV dtype
  bf16.dtype = DType::kBF16;
  EXPECT_FALSE(staging.record(batch, bf16, none.address(), none.address(), 0, 1).ok());  // no sequence
  EXPECT_FALSE(staging.record(batch, bf16, none.address(), none.address(), 1,
                              gpu().info().max_workgroup_count[0] + 1).ok());  // beyond the grid
  bf16.head_dim = 3;
  bf16.block_size = 1;
  bf16.num_kv_heads = 1;
  EXPECT_FALSE(staging.record(batch, bf16, none.address(), none.address(), 1, 1).ok());  // 3 elements a block
  EXPECT_TRUE(batch.submit_and_wait().ok());  // nothing was recorded
}

}  // namespace
}  // namespace kvtier
