// The CUDA door of EmbeddedCache on a machine without a CUDA driver (this project's VM): every
// device call fails with a clear error, is counted, and stores nothing; the host-side halves (which
// blocks a save must stage, the block-id check) work as they do everywhere. The CUDA paths
// themselves are tested from Python on the H100 host (tests/python/test_cuda.py).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "inprocess/cuda/cuda_driver.h"
#include "inprocess/embedded_cache.h"

namespace kvtier {
namespace {

std::vector<uint32_t> prompt(size_t n, uint32_t seed) {
  std::vector<uint32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<uint32_t>((seed * 7919 + i * 31) % 32000);
  return t;
}

double metric(EmbeddedCache& c, const char* name) {
  auto j = nlohmann::json::parse(*c.stats_json());
  return j[name][0]["value"].get<double>();
}

double rejected(EmbeddedCache& c) { return metric(c, "kvtier_embedded_rejected_calls_total"); }

class EmbeddedCacheCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::CudaDriver::get().ok()) GTEST_SKIP() << "a CUDA driver is present; test_cuda.py covers this machine";
    EmbeddedCacheOptions o;
    o.layout = "tiny";
    o.ram_capacity = 8 << 20;
    cache_ = std::move(EmbeddedCache::open(o)).value();
  }
  std::unique_ptr<EmbeddedCache> cache_;
};

TEST_F(EmbeddedCacheCudaTest, WithoutADriverEveryDeviceCallFailsClearlyAndStoresNothing) {
  const std::vector<uint32_t> tokens = prompt(64, 1);
  const std::vector<size_t> all = {0, 1, 2, 3};
  const DeviceStaging staging{0, 0, {0x100000}, 4};
  auto saved = cache_->save_device_blocks({tokens}, all, staging);
  ASSERT_FALSE(saved.ok());
  EXPECT_EQ(saved.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(saved.status().message().find("CUDA driver"), std::string::npos) << saved.status().message();
  auto loaded = cache_->load_device_blocks({tokens}, LoadOptions{}, 4, staging,
                                           [](size_t, size_t, size_t) { return ok_status(); });
  EXPECT_FALSE(loaded.ok());
  auto stored = cache_->store_device_block({prompt(16, 2)}, std::nullopt, staging);
  EXPECT_FALSE(stored.ok());
  auto pinned = cache_->pin_for_device({tokens}, 0, 4, 0);
  ASSERT_FALSE(pinned.ok());
  EXPECT_EQ(pinned.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(cache_->lookup({tokens})->matched_tokens, 0u);
  EXPECT_EQ(cache_->lookup({prompt(16, 2)})->matched_tokens, 0u);
  EXPECT_EQ(metric(*cache_, "kvtier_embedded_cuda_failures_total"), 4);  // failures, not rejections
  EXPECT_EQ(rejected(*cache_), 0);
  // One the engine's side met on a thread of its own is counted with them.
  cache_->report_device_failure("waiting for a load's kernels: an illegal memory access");
  EXPECT_EQ(metric(*cache_, "kvtier_embedded_cuda_failures_total"), 5);
  EXPECT_EQ(metric(*cache_, "kvtier_embedded_cuda_pin_failures_total"), 0);
  // A device that is no CUDA ordinal is bad input, rejected before the driver is asked.
  auto bad = cache_->pin_for_device({tokens}, 0, 4, -1);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(rejected(*cache_), 1);
}

TEST_F(EmbeddedCacheCudaTest, ReadsInPlaceAreCountedOnlyWhenReportedAndNeverWithoutADriver) {
  // pin_for_device counts nothing itself (a caller whose first read fails copies the blocks and
  // they count then); the report counts them, and needs a device to have read them.
  auto reported = cache_->report_read_in_place(4);
  ASSERT_FALSE(reported.ok());
  EXPECT_EQ(reported.code(), StatusCode::kUnavailable);
  EXPECT_EQ(metric(*cache_, "kvtier_embedded_loaded_blocks_total"), 0);
}

TEST_F(EmbeddedCacheCudaTest, MissingBlocksAreThoseTheCacheDoesNotHold) {
  const std::vector<uint32_t> tokens = prompt(64 + 5, 3);
  std::vector<uint8_t> block(cache_->block_bytes(), 7);
  const std::span<const uint32_t> first(tokens.data(), 16);
  auto h = cache_->store_bytes({first}, std::nullopt, block);
  ASSERT_TRUE(h.ok());
  const std::span<const uint32_t> third_parent(tokens.data(), 32);
  auto second = cache_->block_hashes({third_parent});
  ASSERT_TRUE(second.ok());
  ASSERT_TRUE(cache_->store_bytes({std::span(tokens.data() + 32, 16)}, (*second)[1], block).ok());
  // Blocks 0 and 2 are held; 1 and 3 are not; the partial fifth block has no hash.
  EXPECT_EQ(*cache_->missing_blocks({tokens}, 99), (std::vector<size_t>{1, 3}));
  EXPECT_EQ(*cache_->missing_blocks({tokens}, 2), (std::vector<size_t>{1}));
}

TEST_F(EmbeddedCacheCudaTest, BlockIdsOutsideTheEnginesBlocksAreRefusedAndCounted) {
  const std::vector<int64_t> ok_ids = {0, 5, 9};
  EXPECT_TRUE(cache_->check_block_ids(ok_ids, 10).ok());
  const double before = rejected(*cache_);
  for (const std::vector<int64_t>& bad : {std::vector<int64_t>{0, 10}, std::vector<int64_t>{-1}}) {
    const Status st = cache_->check_block_ids(bad, 10);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("outside"), std::string::npos) << st.message();
  }
  EXPECT_EQ(rejected(*cache_), before + 2);
}

TEST_F(EmbeddedCacheCudaTest, AStagingRingWithoutBuffersIsRefusedBeforeAnyDriverIsNeeded) {
  const DeviceStaging none{0, 0, {}, 0};
  const std::vector<size_t> one = {0};
  auto saved = cache_->save_device_blocks({prompt(16, 4)}, one, none);
  ASSERT_FALSE(saved.ok());
  EXPECT_EQ(saved.status().code(), StatusCode::kInvalidArgument);
  const DeviceStaging small{0, 0, {0x100000}, 1};
  const std::vector<size_t> two = {0, 1};
  auto too_many = cache_->save_device_blocks({prompt(32, 4)}, two, small);
  ASSERT_FALSE(too_many.ok());
  EXPECT_NE(too_many.status().message().find("holds 1 blocks"), std::string::npos) << too_many.status().message();
}

}  // namespace
}  // namespace kvtier
