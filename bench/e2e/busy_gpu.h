// BusyGpu: keeps the GPU computing before a table's timed run, so every run starts on a GPU at
// work, as a server under load would be. An idle GPU wakes up slowly (H200 host: a tiny 16-token
// forward after a RAM load and 200 ms idle took 2.86 ms against 0.96 after 20 ms; the tiny
// table's GPU-hit forward 0.47 ms of GPU time in one process and 0.98-1.01 in two others).
#pragma once

#include <memory>

#include "base/status.h"
#include "engine/blocks/gpu_block_pool.h"
#include "engine/model/llama_model.h"

namespace kvtier::bench {

class BusyGpu {
 public:
  // The uncached forward of a prompt of up to 16 blocks (within the model's positions), on blocks
  // of its own: no cache, no cost model touched.
  static Result<std::unique_ptr<BusyGpu>> create(VulkanContext& ctx, LlamaModel& model,
                                                 std::shared_ptr<const KvLayout> layout);
  // Forwards one after another for at least `seconds` (none for 0).
  Status run(double seconds);

 private:
  BusyGpu(LlamaModel& model, std::unique_ptr<GpuBlockPool> pool, ForwardBatch batch)
      : model_(model), pool_(std::move(pool)), batch_(std::move(batch)) {}
  LlamaModel& model_;
  std::unique_ptr<GpuBlockPool> pool_;
  ForwardBatch batch_;
};

}  // namespace kvtier::bench
