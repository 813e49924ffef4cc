// Timing GPU launches for the engine's benchmarks: warmed up first (pipelines compiled, caches
// filled, clocks ramped: a fresh process's first submissions ran 3-4x slow on the H100), then the
// median of repetitions, each a submission of back-to-back launches between GPU timestamps.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <vector>

#include "bench/harness/bench_report.h"
#include "engine/vulkan/command_batch.h"
#include "engine/vulkan/gpu_timer.h"

namespace kvtier::bench {

// A GPU benchmark that cannot go on: the reason on stderr, exit code 1.
[[noreturn]] inline void exit_with(const Status& s) {
  std::cerr << s.to_string() << "\n";
  std::exit(1);
}

// The benchmark's Vulkan context, or exit_with() why there is none.
inline std::unique_ptr<VulkanContext> vulkan_or_exit() {
  auto ctx = VulkanContext::create();
  if (!ctx.ok()) exit_with(ctx.status());
  return std::move(ctx).value();
}

// How long each measurement first runs its launches untimed (at least one submission), and the
// first one in a process: on the H200 host the first matmul shapes of a fresh process ran 5x slow
// after 2 s of their own launches (docs/benchmarks.md, 2026-11-27), so the first waits longer.
inline constexpr double kWarmUpSeconds = 0.25;
inline constexpr double kFirstWarmUpSeconds = 10.0;

// Runs `launch` (a Status) at least once and for kWarmUpSeconds, or kFirstWarmUpSeconds the first
// time at this call site: pipelines, scratch, and the GPU itself. The first time it then goes on
// until the launch has settled — the median of its last kSettledLaunches wall times within 10 %
// of the fastest seen — for at most kMaxWarmUpSeconds, and says on stderr what it took: on freshly
// started H200 hosts the first stack of a process ran its forwards 3-4x slow after 10 s of them
// (docs/benchmarks.md, 2026-11-28). The first error ends it.
inline constexpr double kMaxWarmUpSeconds = 60.0;
inline constexpr size_t kSettledLaunches = 8;
template <typename F>
Status warm_up(F launch) {
  using Clock = std::chrono::steady_clock;
  static bool first =
      true;  // one per F, so per call site: each table warms up before its first row
  const bool settle = first;
  const auto start = Clock::now();
  const auto end =
      start + std::chrono::duration<double>(first ? kFirstWarmUpSeconds : kWarmUpSeconds);
  const auto give_up = start + std::chrono::duration<double>(kMaxWarmUpSeconds);
  first = false;
  std::vector<double> times;
  auto settled = [&] {
    if (times.size() < kSettledLaunches) return false;
    std::vector<double> last(times.end() - kSettledLaunches, times.end());
    return percentile(last, 0.5) <= 1.1 * *std::min_element(times.begin(), times.end());
  };
  Clock::time_point now;
  do {
    const auto t0 = Clock::now();
    KVTIER_RETURN_IF_ERROR(launch());
    now = Clock::now();
    times.push_back(std::chrono::duration<double>(now - t0).count());
  } while (now < end || (settle && !settled() && now < give_up));
  if (settle) {
    std::vector<double> last(times.end() - std::min(times.size(), kSettledLaunches), times.end());
    std::cerr << "warm-up: " << times.size() << " launches in "
              << std::chrono::duration<double>(now - start).count() << " s; the last "
              << last.size() << " at a median " << percentile(last, 0.5) * 1e3
              << " ms, the fastest " << *std::min_element(times.begin(), times.end()) * 1e3 << " ms"
              << (settled() ? "" : " (not settled: gave up)") << "\n";
  }
  return ok_status();
}

// Seconds per call of `record`, median of `reps` submissions of `per_submit` calls each: between
// `timer`'s timestamps around the calls, or with no timer (--host-timed, or a device without
// timestamps) the host's submit-and-wait. Submissions of `record` run for kWarmUpSeconds first
// (kFirstWarmUpSeconds in a process's first measurement).
template <typename F>
Result<double> time_launches(VulkanContext& ctx, GpuTimer* timer, int per_submit, int reps,
                             F record) {
  using Clock = std::chrono::steady_clock;
  KVTIER_RETURN_IF_ERROR(warm_up([&]() -> Status {
    KVTIER_ASSIGN_OR_RETURN(CommandBatch b, CommandBatch::begin(ctx));
    KVTIER_RETURN_IF_ERROR(record(b));
    return b.submit_and_wait();
  }));
  std::vector<double> samples;
  for (int r = 0; r < reps; ++r) {
    KVTIER_ASSIGN_OR_RETURN(CommandBatch b, CommandBatch::begin(ctx));
    if (timer) timer->start(b);
    for (int i = 0; i < per_submit; ++i) KVTIER_RETURN_IF_ERROR(record(b));
    if (timer) timer->stop(b);
    auto t0 = Clock::now();
    KVTIER_RETURN_IF_ERROR(b.submit_and_wait());
    double t = std::chrono::duration<double>(Clock::now() - t0).count();
    if (timer) {
      KVTIER_ASSIGN_OR_RETURN(t, timer->seconds());
    }
    samples.push_back(t / per_submit);
  }
  return percentile(samples, 0.5);
}

}  // namespace kvtier::bench
