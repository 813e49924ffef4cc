// e2e_bench's hit-plan table: for a model on the engine, a prompt whose whole prefix is cached in
// RAM or on the SSD reaches its first token by recomputing it (uncached), loading it (load-only),
// the plan the cost model picks (plan), or the best split found by trying many (best sweep). The
// planner should be as fast as the better of the first two, faster where they are close, and near
// the sweep's best.
#pragma once

#include <string>
#include <vector>

#include "bench/harness/bench_report.h"
#include "engine/model/llama_weights.h"
#include "engine/vulkan/vulkan_context.h"

namespace kvtier::bench {

struct PlanBenchOptions {
  std::string model_name;  // for the table: "tiny", "1b"
  LlamaConfig config;
  std::vector<int> prompts;
  int reps = 3;
  int sweep_points = 9;  // splits tried, evenly from all loaded to all computed
  std::string dir;       // where the SSD tiers live
  // The sweep's loads are given up after this multiple of their predicted time (0: never): with a
  // tiny factor every split becomes "front computed, the rest computed as a second chunk".
  double sweep_deadline_factor = 0;
  // Before every run (uncached or hit alike, after a hit's eviction and flush): this long idle,
  // then this long of short forwards on a pool of their own, so every run starts from the same
  // GPU state. Idle alone measured the GPU's wake-up: after 200 ms idle a 16-token forward took
  // 2.86 ms, against 0.96 after 20 ms (H200, tiny; docs/benchmarks.md).
  int pause_ms = 0;
  int busy_ms = 30;
};

// Appends one row per (prompt, source) to `report`, whose columns are plan_columns().
void bench_plans(VulkanContext& ctx, const PlanBenchOptions& options, Report& report);
std::vector<std::string> plan_columns();

}  // namespace kvtier::bench
