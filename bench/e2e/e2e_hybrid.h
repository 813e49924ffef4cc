// e2e_bench's hybrid table (issue 35): the tiny hybrid model (tiny_hybrid: 6 Gated DeltaNet + 2
// attention layers) through HybridGenerator with its prefix not cached, or cached with its KV
// blocks on the GPU, in RAM or on the SSD (the state snapshot beside them: RAM for the first two,
// the SSD for the last) — time to first token, split into restore and prefill, and the bytes a
// cached token costs: the attention layers' KV and the snapshot's share.
#pragma once

#include <string>
#include <vector>

#include "bench/harness/bench_report.h"
#include "engine/vulkan/vulkan_context.h"

namespace kvtier::bench {

void bench_hybrid(VulkanContext& ctx, const std::vector<int>& prompts, int reps,
                  const std::string& dir, Report& report);
std::vector<std::string> hybrid_columns();

}  // namespace kvtier::bench
