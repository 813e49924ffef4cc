// Timing GPU launches for the engine's benchmarks: warmed up first (pipelines compiled, caches
// filled, clocks ramped: a fresh process's first submissions ran 3-4x slow on the H100), then the
// median of repetitions, each a submission of back-to-back launches between GPU timestamps.
#pragma once

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
// time at this call site: pipelines, scratch, and the GPU itself. The first error ends it.
template <typename F>
Status warm_up(F launch) {
  static bool first =
      true;  // one per F, so per call site: each table warms up before its first row
  const auto end = std::chrono::steady_clock::now() +
                   std::chrono::duration<double>(first ? kFirstWarmUpSeconds : kWarmUpSeconds);
  first = false;
  do {
    KVTIER_RETURN_IF_ERROR(launch());
  } while (std::chrono::steady_clock::now() < end);
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
