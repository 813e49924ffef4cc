// The compute and transfer lanes: each runs its batches in order on a timeline of its own, a batch
// sees what the other lane wrote before the host handed it over, and (where the device gives the
// transfer lane a queue of its own) an upload is not held up by a compute batch still running —
// before the lanes, every submission waited for the one before it, so a block's upload queued
// behind the prefill it was meant to overlap.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/engine/engine_test_env.h"

namespace kvtier {
namespace {

using testing::gpu;

constexpr uint64_t kBytes = 1 << 16;

// Fills `dst` with `word` on `lane` and waits.
Status fill_on(Lane lane, const GpuBuffer& dst, uint32_t word) {
  KVTIER_ASSIGN_OR_RETURN(CommandBatch b, CommandBatch::begin(gpu(), lane));
  b.fill(dst, 0, dst.size(), word);
  b.barrier();
  return b.submit_and_wait();
}

// Copies `src` into the host-visible `dst` on `lane`, waits, and says whether every word is `word`.
::testing::AssertionResult copied_on(Lane lane, const GpuBuffer& src, const GpuBuffer& dst, uint32_t word) {
  auto b = CommandBatch::begin(gpu(), lane);
  if (!b.ok()) return ::testing::AssertionFailure() << b.status().to_string();
  b->copy(src, 0, dst, 0, src.size());
  b->barrier();
  if (Status st = b->submit_and_wait(); !st.ok()) return ::testing::AssertionFailure() << st.to_string();
  if (Status st = dst.invalidate(0, dst.size()); !st.ok()) return ::testing::AssertionFailure() << st.to_string();
  const auto* w = reinterpret_cast<const uint32_t*>(dst.mapped());
  for (uint64_t i = 0; i < dst.size() / 4; ++i) {
    if (w[i] != word) return ::testing::AssertionFailure() << "word " << i << ": " << std::hex << w[i];
  }
  return ::testing::AssertionSuccess();
}

TEST(LanesTest, WhatOneLaneWroteTheOtherReadsExactly) {
  auto device = GpuBuffer::create(gpu(), kBytes, MemoryKind::kDevice);
  auto host = GpuBuffer::create(gpu(), kBytes, MemoryKind::kDownload);
  ASSERT_TRUE(device.ok() && host.ok());
  for (uint32_t round = 0; round < 16; ++round) {
    const Lane writer = round % 2 ? Lane::kTransfer : Lane::kCompute;
    const Lane reader = round % 2 ? Lane::kCompute : Lane::kTransfer;
    const uint32_t word = 0x6b000000u + round;
    ASSERT_TRUE(fill_on(writer, *device, word).ok());
    ASSERT_TRUE(copied_on(reader, *device, *host, word)) << "round " << round;
  }
}

TEST(LanesTest, EachLaneCountsItsOwnTimeline) {
  auto device = GpuBuffer::create(gpu(), kBytes, MemoryKind::kDevice);
  ASSERT_TRUE(device.ok());
  const uint64_t compute = gpu().completed(Lane::kCompute), transfer = gpu().completed(Lane::kTransfer);
  ASSERT_TRUE(fill_on(Lane::kTransfer, *device, 1).ok());
  ASSERT_TRUE(fill_on(Lane::kTransfer, *device, 2).ok());
  EXPECT_EQ(gpu().completed(Lane::kTransfer), transfer + 2);
  EXPECT_EQ(gpu().completed(Lane::kCompute), compute);
  ASSERT_TRUE(fill_on(Lane::kCompute, *device, 3).ok());
  EXPECT_EQ(gpu().completed(Lane::kCompute), compute + 1);
  EXPECT_EQ(gpu().completed(Lane::kTransfer), transfer + 2);
}

// A compute batch held on an event the host has not set yet: a long prefill that ends when the
// test says so. Let go (and waited for) in its destructor whatever failed, since a context
// destroyed with it pending would hang.
class HeldComputeBatch {
 public:
  explicit HeldComputeBatch(VulkanContext& ctx) : ctx_(ctx) {
    VkEventCreateInfo eci{};
    eci.sType = VK_STRUCTURE_TYPE_EVENT_CREATE_INFO;
    ok_ = vkCreateEvent(ctx.device(), &eci, nullptr, &event_) == VK_SUCCESS;
    auto commands = ctx.acquire_commands(Lane::kCompute);
    ok_ = ok_ && commands.ok();
    if (!ok_) return;
    commands_ = *commands;
    VkCommandBufferBeginInfo bi{};
    bi.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO;
    ok_ = vkBeginCommandBuffer(commands_.cb, &bi) == VK_SUCCESS;
    vkCmdWaitEvents(commands_.cb, 1, &event_, VK_PIPELINE_STAGE_HOST_BIT, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, 0,
                    nullptr, 0, nullptr, 0, nullptr);
    ok_ = ok_ && vkEndCommandBuffer(commands_.cb) == VK_SUCCESS;
    auto value = ok_ ? ctx.submit(commands_.cb, Lane::kCompute) : Result<uint64_t>(internal_error("not recorded"));
    ok_ = value.ok();
    if (ok_) value_ = *value;
  }
  ~HeldComputeBatch() {
    if (value_) {
      let_go();
      (void)ctx_.wait(value_, Lane::kCompute);
    }
    if (commands_.cb) ctx_.release_commands(commands_, Lane::kCompute);
    if (event_) vkDestroyEvent(ctx_.device(), event_, nullptr);
  }
  bool ok() const { return ok_; }
  uint64_t value() const { return value_; }
  void let_go() { vkSetEvent(ctx_.device(), event_); }

 private:
  VulkanContext& ctx_;
  bool ok_ = false;
  VkEvent event_ = VK_NULL_HANDLE;
  VulkanContext::Commands commands_;
  uint64_t value_ = 0;
};

// A wait that cannot finish says so at its timeout instead of hanging (lavapipe too: one queue).
TEST(LanesTest, AWaitWithATimeoutSaysSoInsteadOfHanging) {
  VulkanContext& ctx = gpu();
  HeldComputeBatch held(ctx);
  ASSERT_TRUE(held.ok());
  const Status late = ctx.wait(held.value(), Lane::kCompute, std::chrono::milliseconds(50));
  EXPECT_EQ(late.code(), StatusCode::kUnavailable) << late.to_string();
  EXPECT_NE(late.message().find("not reached in time"), std::string::npos);
  held.let_go();
  EXPECT_TRUE(ctx.wait(held.value(), Lane::kCompute, std::chrono::seconds(10)).ok());
}

// The wait's knobs from the environment: microseconds as given, unset as the default (-1), and a
// value that is not a number of microseconds ignored (the default), not read as 0 — which would
// turn the poll or the naps off without a word.
TEST(LanesTest, WaitKnobsFromTheEnvironmentIgnoreWhatIsNotANumber) {
  struct Saved {
    const char* name;
    std::string value;
    bool set;
  };
  std::vector<Saved> saved;
  for (const char* name : {"KVTIER_VK_SPIN_US", "KVTIER_VK_NAP_US"}) {
    const char* v = std::getenv(name);
    saved.push_back({name, v ? v : "", v != nullptr});
  }
  ::unsetenv("KVTIER_VK_SPIN_US");
  ::setenv("KVTIER_VK_NAP_US", "300", 1);
  VulkanOptions o = VulkanOptions::from_environment();
  EXPECT_EQ(o.spin_wait_us, -1);
  EXPECT_EQ(o.nap_us, 300);
  for (const char* bad : {"abc", "50us", "-5", "", "99999999999"}) {
    SCOPED_TRACE(bad);
    ::setenv("KVTIER_VK_SPIN_US", bad, 1);
    ::setenv("KVTIER_VK_NAP_US", "0", 1);
    o = VulkanOptions::from_environment();
    EXPECT_EQ(o.spin_wait_us, -1);
    EXPECT_EQ(o.nap_us, 0);
  }
  for (const Saved& s : saved) {
    if (s.set)
      ::setenv(s.name, s.value.c_str(), 1);
    else
      ::unsetenv(s.name);
  }
}

// A wait that polls the timeline first (VulkanOptions::spin_wait_us, on by default on a GPU) and
// then sleeps, in the driver or in naps between looks at the timeline (VulkanOptions::nap_us, on
// by default on a GPU): one whose batch finishes while it polls returns only then, one whose batch
// finishes after the poll goes on sleeping until it does, and a batch that never finishes still
// times out.
TEST(LanesTest, APollingWaitReturnsWhenTheBatchIsDoneAndNotBefore) {
  struct Waiting {
    int spin_us, nap_us;
  };
  for (const Waiting w : {Waiting{20000, 0}, Waiting{20000, 50}, Waiting{0, 200}}) {
    SCOPED_TRACE("spin " + std::to_string(w.spin_us) + " us, nap " + std::to_string(w.nap_us) +
                 " us");
    VulkanOptions options = VulkanOptions::from_environment();
    options.spin_wait_us = w.spin_us;
    options.nap_us = w.nap_us;
    auto ctx = VulkanContext::create(options);
    ASSERT_TRUE(ctx.ok()) << ctx.status().to_string();
    for (const auto release_after : {std::chrono::milliseconds(2), std::chrono::milliseconds(60)}) {
      SCOPED_TRACE(release_after.count());
      HeldComputeBatch held(**ctx);
      ASSERT_TRUE(held.ok());
      std::atomic<bool> released{false};
      std::thread releaser([&] {
        std::this_thread::sleep_for(release_after);
        released = true;
        held.let_go();
      });
      const Status st = (*ctx)->wait(held.value(), Lane::kCompute, std::chrono::seconds(10));
      EXPECT_TRUE(released.load());  // not before the batch could run
      releaser.join();
      EXPECT_TRUE(st.ok()) << st.to_string();
      EXPECT_EQ((*ctx)->completed(Lane::kCompute), held.value());
    }
    HeldComputeBatch never(**ctx);
    ASSERT_TRUE(never.ok());
    const Status late = (*ctx)->wait(never.value(), Lane::kCompute, std::chrono::milliseconds(5));
    EXPECT_EQ(late.code(), StatusCode::kUnavailable) << late.to_string();
  }
}

// The held batch stands for a long prefill: the transfer lane's batch must finish meanwhile. Needs
// a second queue (one queue runs its submissions one after another, whichever lane they belong
// to): on the H100, not on lavapipe.
TEST(LanesTest, AnUploadIsNotHeldUpByARunningComputeBatch) {
  VulkanContext& ctx = gpu();
  if (!ctx.info().transfer_lane_own_queue) {
    GTEST_SKIP() << ctx.info().name << " gives the transfer lane no queue of its own";
  }
  HeldComputeBatch held(ctx);
  ASSERT_TRUE(held.ok());
  auto device = GpuBuffer::create(ctx, kBytes, MemoryKind::kDevice);
  auto host = GpuBuffer::create(ctx, kBytes, MemoryKind::kDownload);
  ASSERT_TRUE(device.ok() && host.ok());
  {
    // Waited for with a timeout: queued behind the held batch (one timeline) it would never finish,
    // and the test must fail rather than hang.
    auto fill = CommandBatch::begin(ctx, Lane::kTransfer);
    ASSERT_TRUE(fill.ok());
    fill->fill(*device, 0, kBytes, 0x77u);
    fill->barrier();
    auto filled = fill->submit();
    ASSERT_TRUE(filled.ok());
    const Status in_time = ctx.wait(*filled, Lane::kTransfer, std::chrono::seconds(10));
    if (!in_time.ok()) held.let_go();  // before `fill` waits for itself
    EXPECT_TRUE(in_time.ok()) << "the transfer lane waited for the compute lane: " << in_time.to_string();
  }
  EXPECT_TRUE(copied_on(Lane::kTransfer, *device, *host, 0x77u));
  EXPECT_LT(ctx.completed(Lane::kCompute), held.value()) << "the held batch cannot have completed";
  held.let_go();
  ASSERT_TRUE(ctx.wait(held.value(), Lane::kCompute).ok());
  EXPECT_GE(ctx.completed(Lane::kCompute), held.value());
}

}  // namespace
}  // namespace kvtier
