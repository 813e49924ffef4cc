// reshape_and_cache, gather/scatter and quantize/dequantize on the GPU against their CPU
// definitions: these move or transform stored data, so they must match bit for bit.
#include <gtest/gtest.h>

#include "engine/attention/reshape_and_cache.h"
#include "engine/blocks/affine_quant_kernels.h"
#include "engine/blocks/block_transfer.h"
#include "engine/reference/reference_cache_ops.h"
#include "serialize/affine_quant.h"
#include "tests/engine/engine_test_env.h"
#include "tests/support/test_blocks.h"

namespace kvtier {
namespace {

using testing::from_gpu;
using testing::gpu;
using testing::to_gpu;

std::vector<uint8_t> random_tensor(DType dt, size_t n, uint64_t seed, testing::Values kind) {
  std::vector<uint8_t> v(n * dtype_size(dt));
  std::mt19937_64 rng(seed);
  testing::fill_tensor(dt, v, rng, kind, 64);
  return v;
}

TEST(VulkanContextTest, FindsADeviceWithWhatTheKernelsNeed) {
  const DeviceInfo& info = gpu().info();
  EXPECT_FALSE(info.name.empty());
  EXPECT_GE(info.subgroup_size, 4u);
  EXPECT_GE(info.max_shared_memory, 16u * 1024);
  std::cout << "device: " << info.name << " (" << info.driver << "), subgroup " << info.subgroup_size
            << "\n";
}

struct ReshapeCase {
  DType in, cache;
};

class ReshapeAndCacheTest : public ::testing::TestWithParam<ReshapeCase> {};

TEST_P(ReshapeAndCacheTest, WritesSlotsBitExactAndSkipsMinusOne) {
  const auto [in_dt, cache_dt] = GetParam();
  const int heads = 2, dim = 64, block = 16, blocks = 6, tokens = 37;
  const size_t per_token = heads * dim;
  auto key = random_tensor(in_dt, tokens * per_token, 1, testing::Values::kWithSpecials);
  auto value = random_tensor(in_dt, tokens * per_token, 2, testing::Values::kWithSpecials);
  std::vector<int32_t> slots(tokens);
  std::mt19937 rng(3);
  std::vector<int32_t> free_slots(blocks * block);
  std::iota(free_slots.begin(), free_slots.end(), 0);
  std::shuffle(free_slots.begin(), free_slots.end(), rng);
  for (int t = 0; t < tokens; ++t) slots[t] = t % 5 == 4 ? -1 : free_slots[t];
  // Start from noise so "untouched" is checked too.
  auto k_cache = random_tensor(cache_dt, blocks * block * per_token, 4, testing::Values::kRandom);
  auto v_cache = random_tensor(cache_dt, blocks * block * per_token, 5, testing::Values::kRandom);

  GpuBuffer gk = to_gpu(key), gv = to_gpu(value), gs = to_gpu(slots);
  GpuBuffer gkc = to_gpu(k_cache), gvc = to_gpu(v_cache);
  PagedKvView view{gkc.address(), gvc.address(), blocks, block, heads, dim, cache_dt};
  auto batch = std::move(CommandBatch::begin(gpu())).value();
  ASSERT_TRUE(ReshapeAndCache(gpu()).record(batch, gk.address(), gv.address(), in_dt, gs.address(),
                                            tokens, view).ok());
  ASSERT_TRUE(batch.submit_and_wait().ok());

  reference::reshape_and_cache(key, value, in_dt, slots, heads, dim, k_cache, v_cache, cache_dt);
  EXPECT_EQ(from_gpu<uint8_t>(gkc, k_cache.size()), k_cache);
  EXPECT_EQ(from_gpu<uint8_t>(gvc, v_cache.size()), v_cache);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ReshapeAndCacheTest,
                         ::testing::Values(ReshapeCase{DType::kF32, DType::kBF16},
                                           ReshapeCase{DType::kF32, DType::kF16},
                                           ReshapeCase{DType::kF32, DType::kF32},
                                           ReshapeCase{DType::kBF16, DType::kBF16},
                                           ReshapeCase{DType::kF16, DType::kF16},
                                           ReshapeCase{DType::kF16, DType::kBF16}),
                         [](const auto& info) {
                           return std::string(dtype_name(info.param.in)) + "_to_" +
                                  std::string(dtype_name(info.param.cache));
                         });

TEST(BlockTransferTest, GatherPacksBlocksLikeTheCpuAndScatterPutsThemBack) {
  // Three layers of different dtypes, as a mixed layout has.
  const DType dts[] = {DType::kBF16, DType::kF32, DType::kF16};
  const int heads = 2, dim = 32, block = 16, blocks = 9;
  std::vector<std::vector<uint8_t>> host(6);
  std::vector<GpuBuffer> dev;
  std::vector<PagedKvView> views;
  for (int l = 0; l < 3; ++l) {
    host[2 * l] = random_tensor(dts[l], blocks * block * heads * dim, 10 + l, testing::Values::kWithSpecials);
    host[2 * l + 1] = random_tensor(dts[l], blocks * block * heads * dim, 20 + l, testing::Values::kRandom);
    dev.push_back(to_gpu(host[2 * l]));
    dev.push_back(to_gpu(host[2 * l + 1]));
    views.push_back({dev[2 * l].address(), dev[2 * l + 1].address(), blocks, block, heads, dim, dts[l]});
  }
  auto transfer = BlockTransfer::create(gpu(), views);
  ASSERT_TRUE(transfer.ok()) << transfer.status().to_string();
  std::vector<reference::LayerArrays> ref;
  for (int l = 0; l < 3; ++l) ref.push_back({host[2 * l], host[2 * l + 1], views[l].block_bytes()});

  const std::vector<int32_t> ids = {7, 0, 3, 8};
  GpuBuffer gids = to_gpu(ids);
  GpuBuffer staging = testing::gpu_zeros(ids.size() * transfer->block_bytes());
  auto batch = std::move(CommandBatch::begin(gpu())).value();
  ASSERT_TRUE(transfer->record_gather(batch, gids.address(), ids.size(), staging.address()).ok());
  ASSERT_TRUE(batch.submit_and_wait().ok());
  const auto packed = reference::gather_blocks(ref, ids);
  ASSERT_EQ(packed.size(), ids.size() * transfer->block_bytes());
  EXPECT_EQ(from_gpu<uint8_t>(staging, packed.size()), packed);

  // Scatter the packed blocks into other slots and compare every array with the CPU's.
  const std::vector<int32_t> targets = {1, 2, 4, 6};
  GpuBuffer gtargets = to_gpu(targets);
  auto batch2 = std::move(CommandBatch::begin(gpu())).value();
  ASSERT_TRUE(transfer->record_scatter(batch2, staging.address(), gtargets.address(), targets.size()).ok());
  ASSERT_TRUE(batch2.submit_and_wait().ok());
  reference::scatter_blocks(packed, ref, targets);
  for (size_t i = 0; i < host.size(); ++i) {
    EXPECT_EQ(from_gpu<uint8_t>(dev[i], host[i].size()), host[i]) << "array " << i;
  }
}

struct QuantCase {
  DType dtype;
  int bits, group;
};

class AffineQuantRoundTripTest : public ::testing::TestWithParam<QuantCase> {};

TEST_P(AffineQuantRoundTripTest, QuantizeAndDequantizeMatchTheCpuBitForBit) {
  const auto [dt, bits, group] = GetParam();
  const Quantization q{bits, group};
  for (testing::Values kind : {testing::Values::kRandom, testing::Values::kKvLike}) {
    const size_t n = 64 * 1024 + 3 * 128;  // groups: an odd count for every group size
    auto values = random_tensor(dt, n, 7 + bits, kind);
    // A constant group and a wide one exercise the eps and edge paths.
    for (int i = 0; i < group; ++i) store_kv_element(dt, values.data(), i, 0.5f);
    for (int i = 0; i < group; ++i) store_kv_element(dt, values.data(), group + i, i * 1000.0f - 3e4f);
    QuantizedSizes qs = quantized_sizes(n, q);
    std::vector<uint32_t> packed(qs.packed_words);
    std::vector<uint8_t> scales(qs.groups * dtype_size(dt)), biases(scales.size());
    ASSERT_TRUE(affine_quantize(dt, values, q, packed, scales, biases).ok());
    std::vector<uint8_t> deq(values.size());
    ASSERT_TRUE(affine_dequantize(dt, q, packed, scales, biases, deq).ok());

    const uint64_t sb = AffineQuantKernels::scales_bytes(n, q, dt);
    GpuBuffer gv = to_gpu(values);
    GpuBuffer gp = testing::gpu_zeros(packed.size() * 4), gs = testing::gpu_zeros(sb),
              gb = testing::gpu_zeros(sb), gstatus = testing::gpu_zeros(16),
              gout = testing::gpu_zeros(values.size());
    AffineQuantKernels k(gpu());
    auto batch = std::move(CommandBatch::begin(gpu())).value();
    ASSERT_TRUE(k.record_quantize(batch, dt, q, n, gv.address(), gp.address(), gs.address(),
                                  gb.address(), gstatus.address()).ok());
    ASSERT_TRUE(k.record_dequantize(batch, dt, q, n, gp.address(), gs.address(), gb.address(),
                                    gout.address()).ok());
    ASSERT_TRUE(batch.submit_and_wait().ok());
    EXPECT_EQ(from_gpu<uint32_t>(gstatus, 1)[0], 0u);
    EXPECT_EQ(from_gpu<uint32_t>(gp, packed.size()), packed);
    EXPECT_EQ(from_gpu<uint8_t>(gs, scales.size()), scales);
    EXPECT_EQ(from_gpu<uint8_t>(gb, biases.size()), biases);
    EXPECT_EQ(from_gpu<uint8_t>(gout, deq.size()), deq);
  }
}

INSTANTIATE_TEST_SUITE_P(
    DtypesBitsGroups, AffineQuantRoundTripTest,
    ::testing::Values(QuantCase{DType::kBF16, 4, 32}, QuantCase{DType::kBF16, 4, 64},
                      QuantCase{DType::kBF16, 8, 128}, QuantCase{DType::kF16, 4, 64},
                      QuantCase{DType::kF16, 8, 32}, QuantCase{DType::kF32, 4, 128},
                      QuantCase{DType::kF32, 8, 64}),
    [](const auto& info) {
      return std::string(dtype_name(info.param.dtype)) + "_b" + std::to_string(info.param.bits) +
             "_g" + std::to_string(info.param.group);
    });

TEST(AffineQuantKernelTest, ANonFiniteValueIsReported) {
  std::vector<uint8_t> values(128 * 2, 0);
  uint16_t inf = 0x7f80;
  std::memcpy(values.data() + 70 * 2, &inf, 2);
  GpuBuffer gv = to_gpu(values), gp = testing::gpu_zeros(128 / 2), gs = testing::gpu_zeros(16),
            gb = testing::gpu_zeros(16), gstatus = testing::gpu_zeros(16);
  auto batch = std::move(CommandBatch::begin(gpu())).value();
  ASSERT_TRUE(AffineQuantKernels(gpu()).record_quantize(batch, DType::kBF16, {4, 64}, 128,
                                                         gv.address(), gp.address(), gs.address(),
                                                         gb.address(), gstatus.address()).ok());
  ASSERT_TRUE(batch.submit_and_wait().ok());
  EXPECT_EQ(from_gpu<uint32_t>(gstatus, 1)[0], 1u);
}

}  // namespace
}  // namespace kvtier
