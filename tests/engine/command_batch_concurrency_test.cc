// Command batches recorded and submitted on several threads at once, as a background fetch's
// uploads run beside a decode step. With one command pool shared by every batch this crashed
// vkQueueSubmit or hung the timeline on NVIDIA; each batch now records into a pool of its own.
#include <gtest/gtest.h>

#include <barrier>
#include <cstring>
#include <thread>

#include "tests/engine/engine_test_env.h"

namespace kvtier {
namespace {

using testing::gpu;

constexpr uint64_t kRegion = 4096;
constexpr int kRegions = 32;

uint32_t pattern(int thread, int round, int region) {
  return 0x5a000000u ^ (static_cast<uint32_t>(thread) << 20) ^ (static_cast<uint32_t>(round) << 8) ^
         static_cast<uint32_t>(region);
}

// One batch: fill each region of `scratch` with its own word, then copy it to `out`, so a
// command lost or recorded into another thread's buffer shows as a wrong word.
Status record_and_run(CommandBatch batch, int thread, int round, const GpuBuffer& scratch,
                      const GpuBuffer& out) {
  for (int r = 0; r < kRegions; ++r)
    batch.fill(scratch, r * kRegion, kRegion, pattern(thread, round, r));
  batch.barrier();
  batch.copy(scratch, 0, out, 0, kRegion * kRegions);
  batch.barrier();
  return batch.submit_and_wait();
}

::testing::AssertionResult holds_rounds_words(const GpuBuffer& out, int thread, int round) {
  if (Status st = out.invalidate(0, out.size()); !st.ok())
    return ::testing::AssertionFailure() << st.to_string();
  const auto* words = reinterpret_cast<const uint32_t*>(out.mapped());
  for (int r = 0; r < kRegions; ++r) {
    for (uint64_t w = 0; w < kRegion / 4; ++w) {
      const uint32_t got = words[r * kRegion / 4 + w];
      if (got != pattern(thread, round, r)) {
        return ::testing::AssertionFailure()
               << "thread " << thread << " round " << round << " region " << r << " word " << w
               << ": " << std::hex << got;
      }
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(CommandBatchConcurrencyTest, ThreadsRecordAndSubmitAtOnceEachBatchExact) {
  constexpr int kThreads = 4;
  constexpr int kRounds = 40;
  VulkanContext& ctx = gpu();
  const auto [compute_before, transfer_before] = ctx.command_pools();

  std::vector<GpuBuffer> scratch, out;
  for (int t = 0; t < kThreads; ++t) {
    auto s = GpuBuffer::create(ctx, kRegion * kRegions, MemoryKind::kDevice);
    auto o = GpuBuffer::create(ctx, kRegion * kRegions, MemoryKind::kDownload);
    ASSERT_TRUE(s.ok() && o.ok());
    scratch.push_back(std::move(s).value());
    out.push_back(std::move(o).value());
  }

  // Round 0: every thread holds an open compute batch before any records, so the pools in use
  // at once number at least the threads.
  std::barrier all_begun(kThreads);
  std::vector<std::string> failures(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < kRounds; ++round) {
        // Odd rounds on the transfer lane: uploads use it.
        auto batch = CommandBatch::begin(ctx, round % 2 == 1 ? Lane::kTransfer : Lane::kCompute);
        if (round == 0) all_begun.arrive_and_wait();
        if (!batch.ok()) {
          failures[t] = batch.status().to_string();
          return;
        }
        if (Status st = record_and_run(std::move(batch).value(), t, round, scratch[t], out[t]);
            !st.ok()) {
          failures[t] = st.to_string();
          return;
        }
        if (auto ok = holds_rounds_words(out[t], t, round); !ok) {
          failures[t] = ok.message();
          return;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], "") << "thread " << t;

  // Pools are reused: no more of them than batches ever open at once on each queue. (Counts are
  // the context's, which a repeated run of this test shares, so the lower bounds are totals.)
  const auto [compute, transfer] = ctx.command_pools();
  EXPECT_GE(compute, static_cast<size_t>(kThreads));
  EXPECT_LE(compute - compute_before, static_cast<size_t>(kThreads));
  EXPECT_GE(transfer, 1u);
  EXPECT_LE(transfer - transfer_before, static_cast<size_t>(kThreads));
}

TEST(CommandBatchConcurrencyTest, AnUnsubmittedBatchGivesItsPoolBackClean) {
  VulkanContext& ctx = gpu();
  auto out = GpuBuffer::create(ctx, kRegion * kRegions, MemoryKind::kDownload);
  auto scratch = GpuBuffer::create(ctx, kRegion * kRegions, MemoryKind::kDevice);
  // Only the dropped batch writes here, so its commands running with the next batch would show.
  auto sentinel = GpuBuffer::create(ctx, kRegion, MemoryKind::kDownload);
  ASSERT_TRUE(out.ok() && scratch.ok() && sentinel.ok());
  std::memset(sentinel->mapped(), 0, kRegion);
  ASSERT_TRUE(sentinel->flush(0, kRegion).ok());
  {
    auto dropped = CommandBatch::begin(ctx);
    ASSERT_TRUE(dropped.ok());
    dropped->fill(*sentinel, 0, kRegion, 0xdeadbeefu);
  }
  const auto pools_before = ctx.command_pools();
  ASSERT_TRUE(
      record_and_run(std::move(CommandBatch::begin(ctx)).value(), 1, 1, *scratch, *out).ok());
  EXPECT_TRUE(holds_rounds_words(*out, 1, 1));
  EXPECT_EQ(ctx.command_pools(), pools_before) << "the dropped batch's pool was not reused";
  ASSERT_TRUE(sentinel->invalidate(0, kRegion).ok());
  const std::vector<uint8_t> zeros(kRegion, 0);
  EXPECT_EQ(std::memcmp(sentinel->mapped(), zeros.data(), kRegion), 0)
      << "the dropped batch's fill ran with the batch that reused its pool";
}

}  // namespace
}  // namespace kvtier
