// GpuTimer: the GPU's clock around recorded commands, as engine_bench times its launches. What
// it reports must be the recorded work's own time: more work takes longer, the time fits inside
// the host's wait for the batch, and a timer whose batch never ran says so.
#include "engine/vulkan/gpu_timer.h"

#include <gtest/gtest.h>

#include <chrono>

#include "tests/engine/engine_test_env.h"

namespace kvtier {
namespace {

using testing::gpu;

std::unique_ptr<GpuTimer> timer() {
  auto t = GpuTimer::create(gpu());
  EXPECT_TRUE(t.ok()) << t.status().to_string();  // lavapipe and NVIDIA both have timestamps
  return t.ok() ? std::move(t).value() : nullptr;
}

// GPU seconds and host seconds of `fills` fills of a 64 MiB buffer in one timed batch.
std::pair<double, double> time_fills(GpuTimer& t, const GpuBuffer& buf, int fills) {
  auto batch = std::move(CommandBatch::begin(gpu())).value();
  t.start(batch);
  for (int i = 0; i < fills; ++i) {
    batch.fill(buf, 0, buf.size(), static_cast<uint32_t>(i));
    batch.barrier();
  }
  t.stop(batch);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(batch.submit_and_wait().ok());
  const double host = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  auto s = t.seconds();
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return {s.ok() ? *s : -1.0, host};
}

TEST(GpuTimerTest, TimesTheRecordedWorkWithinTheHostsWait) {
  auto t = timer();
  ASSERT_NE(t, nullptr);
  auto buf = GpuBuffer::create(gpu(), 64u << 20, MemoryKind::kDevice);
  ASSERT_TRUE(buf.ok()) << buf.status().to_string();
  time_fills(*t, *buf, 1);  // first touch: on lavapipe the buffer's pages fault in (~0.2 s here)
  const auto [one, one_host] = time_fills(*t, *buf, 1);
  const auto [eight, eight_host] = time_fills(*t, *buf, 8);
  EXPECT_GT(one, 0.0);
  EXPECT_LE(one, one_host);
  EXPECT_LE(eight, eight_host);
  EXPECT_GT(eight, one) << "eight fills of 64 MiB timed no longer than one";
}

TEST(GpuTimerTest, SaysSoWhenItsBatchNeverRan) {
  auto t = timer();
  ASSERT_NE(t, nullptr);
  EXPECT_FALSE(t->seconds().ok()) << "read before anything was recorded";
  auto buf = GpuBuffer::create(gpu(), 1u << 20, MemoryKind::kDevice);
  ASSERT_TRUE(buf.ok());
  time_fills(*t, *buf, 1);
  ASSERT_TRUE(t->seconds().ok());
  {  // recorded, then dropped unsubmitted: not the previous measurement
    auto dropped = std::move(CommandBatch::begin(gpu())).value();
    t->start(dropped);
    dropped.fill(*buf, 0, buf->size(), 1);
    t->stop(dropped);
  }
  auto s = t->seconds();
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kFailedPrecondition) << s.status().to_string();
}

}  // namespace
}  // namespace kvtier
