// e2e_bench's engine table: the engine's uncached prefill against PyTorch eager of the same model
// shape on the same GPU (bench/torch_prefill_reference.py, run by e2e_bench where PyTorch has
// CUDA). Every "a hit is N x faster than recomputing" figure in the other tables is only as honest
// as this ratio: a slow engine makes recomputing look expensive.
#pragma once

#include <string>
#include <vector>

#include "bench/harness/bench_report.h"
#include "engine/vulkan/vulkan_context.h"

namespace kvtier::bench {

struct PrefillBenchOptions {
  std::vector<std::string> models;  // "tiny", "1b"
  std::vector<int> prompts;
  int reps = 5;
  std::string torch_script;  // bench/torch_prefill_reference.py; empty: no PyTorch column
  // An empty batch submitted and waited for between PyTorch's forward and ours, untimed: the GPU
  // switches from PyTorch's process to ours before ours is timed, as it would not in a server.
  bool switch_first = true;
};

// One row per (model, prompt): one forward of the whole prompt (its KV written into the paged
// cache, the last row's logits read back), median of `reps` after a warm-up; each rep is a round
// of PyTorch's forward of the same prompt (bench/e2e/torch_prefill_server.h) then ours.
// With `stages`: one more forward per row timed stage by stage (a GPU timestamp after each kind
// of launch), rows {model, prompt, stage, GPU ms, share}.
void bench_prefill(VulkanContext& ctx, const PrefillBenchOptions& options, Report& report,
                   Report* stages = nullptr);
std::vector<std::string> prefill_columns();

}  // namespace kvtier::bench
