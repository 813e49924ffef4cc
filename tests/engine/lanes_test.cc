// The compute and transfer lanes: each runs its batches in order on a timeline of its own, a batch
// sees what the other lane wrote before the host handed it over, and (where the device gives the
// transfer lane a queue of its own) an upload is not held up by a compute batch still running —
// before the lanes, every submission waited for the one before it, so a block's upload queued
// behind the prefill it was meant to overlap.
#include <gtest/gtest.h>

#include <cstring>

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

TEST(Lanes, WhatOneLaneWroteTheOtherReadsExactly) {
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

TEST(Lanes, EachLaneCountsItsOwnTimeline) {
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

// A compute batch held on an event the host has not set yet stands for a long prefill: the
// transfer lane's batch must finish meanwhile. Needs a second queue (one queue runs its
// submissions one after another, whichever lane they belong to): on the H100, not on lavapipe.
TEST(Lanes, AnUploadIsNotHeldUpByARunningComputeBatch) {
  VulkanContext& ctx = gpu();
  if (!ctx.info().transfer_lane_own_queue) {
    GTEST_SKIP() << ctx.info().name << " gives the transfer lane no queue of its own";
  }
  VkEventCreateInfo eci{.sType = VK_STRUCTURE_TYPE_EVENT_CREATE_INFO};
  VkEvent event = VK_NULL_HANDLE;
  ASSERT_EQ(vkCreateEvent(ctx.device(), &eci, nullptr, &event), VK_SUCCESS);
  auto held = ctx.acquire_commands(Lane::kCompute);
  ASSERT_TRUE(held.ok());
  VkCommandBufferBeginInfo bi{.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  ASSERT_EQ(vkBeginCommandBuffer(held->cb, &bi), VK_SUCCESS);
  vkCmdWaitEvents(held->cb, 1, &event, VK_PIPELINE_STAGE_HOST_BIT, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, 0,
                  nullptr, 0, nullptr, 0, nullptr);
  ASSERT_EQ(vkEndCommandBuffer(held->cb), VK_SUCCESS);
  auto value = ctx.submit(held->cb, Lane::kCompute);
  ASSERT_TRUE(value.ok());

  auto device = GpuBuffer::create(ctx, kBytes, MemoryKind::kDevice);
  auto host = GpuBuffer::create(ctx, kBytes, MemoryKind::kDownload);
  ASSERT_TRUE(device.ok() && host.ok());
  ASSERT_TRUE(fill_on(Lane::kTransfer, *device, 0x77u).ok());
  EXPECT_TRUE(copied_on(Lane::kTransfer, *device, *host, 0x77u));
  EXPECT_LT(ctx.completed(Lane::kCompute), *value) << "the held batch cannot have completed";

  ASSERT_EQ(vkSetEvent(ctx.device(), event), VK_SUCCESS);
  ASSERT_TRUE(ctx.wait(*value, Lane::kCompute).ok());
  EXPECT_GE(ctx.completed(Lane::kCompute), *value);
  ctx.release_commands(*held, Lane::kCompute);
  vkDestroyEvent(ctx.device(), event, nullptr);
}

}  // namespace
}  // namespace kvtier
