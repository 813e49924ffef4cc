// The validation layer under the engine's concurrency tests (KVTIER_VK_VALIDATION=1, set by CTest
// for this binary): every test process ends with zero reports of broken rules on the shared
// device, and a rule broken on purpose is seen, so a layer that did not load cannot pass.
#include <gtest/gtest.h>

#include <barrier>
#include <cstdlib>
#include <thread>

#include "tests/engine/engine_test_env.h"

namespace kvtier {
namespace {

using testing::gpu;

class ValidationClean : public ::testing::Environment {
 public:
  void TearDown() override {
    if (const ValidationMessenger* v = gpu().validation()) {
      EXPECT_EQ(v->errors(), 0u) << "the validation layer saw broken Vulkan rules (logged above)";
    }
  }
};
const auto* const kValidationClean = ::testing::AddGlobalTestEnvironment(new ValidationClean);

TEST(ValidationTest, IsOnForTheseTestsAndSeesABrokenRule) {
  if (!VulkanOptions::from_environment().validation) GTEST_SKIP() << "KVTIER_VK_VALIDATION is not 1 (sanitizer builds)";
  ASSERT_NE(gpu().validation(), nullptr);
  // A device of its own, so the shared one stays clean for the check above.
  auto ctx = VulkanContext::create();
  ASSERT_TRUE(ctx.ok()) << ctx.status().to_string();
  ASSERT_NE((*ctx)->validation(), nullptr);
  VkBufferCreateInfo ci{};
  ci.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO;
  ci.size = 0;  // VUID-VkBufferCreateInfo-size-00912: size must be greater than 0
  ci.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT;
  VkBuffer buffer = VK_NULL_HANDLE;
  if (vkCreateBuffer((*ctx)->device(), &ci, nullptr, &buffer) == VK_SUCCESS) {
    vkDestroyBuffer((*ctx)->device(), buffer, nullptr);
  }
  EXPECT_GE((*ctx)->validation()->errors(), 1u);
}

// The bug class that crashed the NVIDIA driver: two threads recording at once into command buffers
// of one pool (which Vulkan wants externally synchronized). Lavapipe runs it fine; the layer's
// thread-safety check must report it. Recording overlaps only by chance, so rounds repeat until
// it is seen (the first round, in every run here).
TEST(ValidationTest, TwoThreadsRecordingFromOnePoolAreReported) {
  if (!VulkanOptions::from_environment().validation) GTEST_SKIP() << "KVTIER_VK_VALIDATION is not 1 (sanitizer builds)";
  auto ctx = VulkanContext::create();
  ASSERT_TRUE(ctx.ok()) << ctx.status().to_string();
  VkDevice dev = (*ctx)->device();
  auto target = GpuBuffer::create(**ctx, 1 << 16, MemoryKind::kDevice);
  ASSERT_TRUE(target.ok()) << target.status().to_string();
  VkCommandPoolCreateInfo pci{};
  pci.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO;
  pci.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  pci.queueFamilyIndex = (*ctx)->compute_family();
  VkCommandPool pool = VK_NULL_HANDLE;
  ASSERT_EQ(vkCreateCommandPool(dev, &pci, nullptr, &pool), VK_SUCCESS);
  VkCommandBuffer cbs[2];
  VkCommandBufferAllocateInfo ai{};
  ai.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO;
  ai.commandPool = pool;
  ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  ai.commandBufferCount = 2;
  ASSERT_EQ(vkAllocateCommandBuffers(dev, &ai, cbs), VK_SUCCESS);
  for (int round = 0; round < 50 && (*ctx)->validation()->errors() == 0; ++round) {
    std::barrier start(2);
    auto record = [&](VkCommandBuffer cb) {
      VkCommandBufferBeginInfo bi{};
      bi.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO;
      start.arrive_and_wait();
      vkBeginCommandBuffer(cb, &bi);
      for (int i = 0; i < 2000; ++i)
        vkCmdFillBuffer(cb, target->handle(), 0, 4096, static_cast<uint32_t>(i));
      vkEndCommandBuffer(cb);
    };
    std::thread other(record, cbs[1]);
    record(cbs[0]);
    other.join();
  }
  EXPECT_GE((*ctx)->validation()->errors(), 1u) << "no THREADING error for a pool recorded from two threads";
  vkDestroyCommandPool(dev, pool, nullptr);
}

}  // namespace
}  // namespace kvtier
