#include "bench/e2e/e2e_prefill.h"

#include <algorithm>
#include <memory>

#include "bench/e2e/e2e_support.h"
#include "bench/e2e/torch_prefill_server.h"
#include "bench/harness/gpu_launch_timing.h"
#include "engine/blocks/gpu_block_pool.h"
#include "engine/model/llama_model.h"

namespace kvtier::bench {
namespace {

// FLOPs of one forward, as the PyTorch script counts them: projections, the last row's logits,
// and causal attention.
double forward_flops(const LlamaConfig& c, double tokens) {
  const double h = c.hidden(), kvd = double(c.num_kv_heads) * c.head_dim;
  const double per_layer = 2 * h * h + 2 * h * kvd + 3 * h * c.ffn;
  return 2 * tokens * per_layer * c.num_layers + 2 * h * c.vocab +
         c.num_layers * 2.0 * 2 * c.num_heads * c.head_dim * tokens * tokens / 2;
}

}  // namespace

std::vector<std::string> prefill_columns() {
  return {"model",         "prompt",           "engine ms",
          "engine GPU ms", "host record ms",   "host setup / to 1st submit / readback / rest ms",
          "TFLOP/s",       "PyTorch eager ms", "engine / PyTorch"};
}

void bench_prefill(VulkanContext& ctx, const PrefillBenchOptions& o, Report& report,
                   Report* stages) {
  const int longest = *std::max_element(o.prompts.begin(), o.prompts.end());
  const auto torch = o.torch_script.empty()
                         ? nullptr
                         : TorchPrefillServer::start(o.torch_script, o.models, longest);
  for (const std::string& name : o.models) {
    LlamaConfig config = name == "1b" ? LlamaConfig::llama_1b_shaped() : LlamaConfig::tiny();
    config.max_positions = longest + 64;
    const LlamaWeights weights = LlamaWeights::synthetic(config);
    auto model = must(LlamaModel::create(ctx, config, weights));
    must(model->time_on_gpu(true));
    const auto layout =
        std::make_shared<const KvLayout>(config.kv_layout(DType::kBF16, kE2eBlockSize));
    auto pool = must(
        GpuBlockPool::create(ctx, layout, {static_cast<uint32_t>(longest / kE2eBlockSize + 2), 0}));
    for (int n : o.prompts) {
      const std::vector<int32_t> prompt = prompt_tokens(n, config.vocab);
      const int blocks = (n + kE2eBlockSize - 1) / kE2eBlockSize;
      auto alloc = must(pool->allocate(blocks));
      const ForwardBatch b = prompt_batch(prompt, alloc.ids);
      // Warm-up: pipelines, scratch, and the GPU itself (bench/harness/gpu_launch_timing.h says
      // why the first one is long): forwards for kWarmUpSeconds, kFirstWarmUpSeconds the first
      // time.
      must(warm_up([&] { return model->forward(b, *pool).status(); }));
      // Round by round: PyTorch's forward, then ours, so both see the GPU in the same state.
      std::vector<double> wall, gpu, record, setup, first_submit, readback, rest, torch_ms;
      for (int r = 0; r < o.reps; ++r) {
        if (torch) {
          if (auto t = torch->prefill_ms(name, n, 1)) torch_ms.push_back(*t);
          if (o.switch_first) {
            CommandBatch empty = must(CommandBatch::begin(ctx));
            must(empty.submit_and_wait());
          }
        }
        const auto t0 = std::chrono::steady_clock::now();
        must(model->forward(b, *pool).status());
        wall.push_back(seconds_since(t0));
        const ForwardTiming& t = model->last_timing();
        record.push_back(t.record_seconds);
        setup.push_back(t.setup_seconds);
        first_submit.push_back(t.first_submit_seconds);
        readback.push_back(t.readback_seconds);
        // The call's time outside its four parts: freeing its batches, returning.
        rest.push_back(wall.back() - t.setup_seconds - t.record_seconds - t.submit_wait_seconds -
                       t.readback_seconds);
        if (t.gpu_seconds) gpu.push_back(*t.gpu_seconds);
      }
      if (stages) {
        must(model->time_on_gpu(true, true));
        must(model->forward(b, *pool).status());
        const ForwardTiming& t = model->last_timing();
        for (const auto& [stage, seconds] : t.stages) {
          stages->add_row({name, std::to_string(n), stage, ms(seconds),
                           t.gpu_seconds ? fmt_double(seconds / *t.gpu_seconds, 3) : "-"});
        }
        must(model->time_on_gpu(true));
      }
      for (int32_t id : alloc.ids) pool->unref(id);
      const double engine_s = median(wall);
      const double gpu_s = gpu.empty() ? 0 : median(gpu);
      // Each round's engine time over its PyTorch time (paired_ratio's reference over subject):
      // a slow GPU period moves both sides of a round together.
      const bool ref = torch_ms.size() == wall.size();
      std::vector<double> torch_s;
      for (double t : torch_ms) torch_s.push_back(t / 1e3);
      report.add_row(
          {name, std::to_string(n), ms(engine_s), gpu.empty() ? "-" : ms(gpu_s), ms(median(record)),
           ms(median(setup)) + " / " + ms(median(first_submit)) + " / " + ms(median(readback)) +
               " / " + ms(median(rest)),
           fmt_double(forward_flops(config, n) / (gpu.empty() ? engine_s : gpu_s) / 1e12, 1),
           ref ? fmt_double(median(torch_ms), 2) : "-",
           ref ? paired_ratio(wall, torch_s).text() : "-"});
    }
  }
}

}  // namespace kvtier::bench
