// e2e_bench's tiny table: the whole CachedGenerator path of the tiny Llama (4 layers, 8/2 heads,
// head_dim 64, BF16 KV) with its prefix not cached, or cached on the GPU, in RAM or on the SSD —
// time to first token, split into restore and prefill, the prefill into recording and GPU time,
// and the GPU tier's uploads; optionally where the first token's forward goes, stage by stage.
#pragma once

#include <vector>

#include "bench/harness/bench_report.h"
#include "cache/plan/hit_planner.h"
#include "engine/vulkan/vulkan_context.h"

namespace kvtier::bench {

// Appends one row per (prompt, where the prefix is) to `report`; with `stage_report`, one row per
// stage of the GPU and uncached rows' first-token forward there. Every timed run follows
// `busy_ms` of other forwards (BusyGpu).
void bench_tiny(VulkanContext& ctx, const std::vector<int>& prompts, int reps, int busy_ms,
                const std::string& dir, HitPolicy policy, Report& report, Report* stage_report);
std::vector<std::string> tiny_columns();
// Median time to submit an empty batch and see it done: the floor under every forward.
double empty_batch_round_trip(VulkanContext& ctx);

}  // namespace kvtier::bench
