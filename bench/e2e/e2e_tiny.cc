#include "bench/e2e/e2e_tiny.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "bench/e2e/busy_gpu.h"
#include "bench/e2e/e2e_support.h"
#include "bench/harness/gpu_launch_timing.h"
#include "cache/cache_stack.h"
#include "engine/model/llama_model.h"
#include "generate/cached_generator.h"

namespace kvtier::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kBlockSize = kE2eBlockSize;

struct TinyCase {
  explicit TinyCase(std::string n) : name(std::move(n)) {}
  std::string name;
  std::vector<double> ttft, restore, prefill, record, gpu, upload;
  uint64_t upload_batches = 0, uploaded = 0, direct = 0, regions = 0;  // over every repetition
  std::vector<std::pair<std::string, std::vector<double>>> stages;     // --profile-stages
  size_t cached_tokens = 0;
  std::optional<double> predicted_load, predicted_compute;  // the last repetition's plan
  bool identical = true;  // first-token logits equal to the uncached run's, bit for bit
};

}  // namespace

void bench_tiny(VulkanContext& ctx, const std::vector<int>& prompts, int reps, int busy_ms,
                const std::string& dir, HitPolicy policy, Report& report, Report* stage_report) {
  LlamaConfig config = LlamaConfig::tiny();
  config.max_positions = *std::max_element(prompts.begin(), prompts.end()) + 64;
  const LlamaWeights weights = LlamaWeights::synthetic(config);
  auto model = must(LlamaModel::create(ctx, config, weights));
  // 2 timestamps per forward, or one per stage (--profile-stages; the stamps cost a little).
  const bool gpu_clock = model->time_on_gpu(true, stage_report != nullptr).ok();
  auto layout = std::make_shared<const KvLayout>(config.kv_layout(DType::kBF16, kBlockSize));
  auto busy = must(BusyGpu::create(ctx, *model, layout));
  for (int p : prompts) {
    const auto prompt = prompt_tokens(p, config.vocab);
    const uint32_t blocks = static_cast<uint32_t>(p / kBlockSize);
    // Stack 1: GPU + RAM (room for everything). Stack 2: GPU + a one-block RAM + SSD, so what the
    // GPU evicts lands on the SSD.
    const TinyStacks options =
        tiny_stacks(ctx, layout, blocks, 0, dir + "/tiny-" + std::to_string(p));
    auto stack = must(CacheStack::open(options.ram));
    auto ssd_stack = must(CacheStack::open(options.ssd));
    PrefixHasher hasher(HashAlgorithm::kSha256, Namespace{"e2e", layout->fingerprint(), ""},
                        kBlockSize);
    HitOptions hit;
    hit.policy = policy;
    CachedGenerator gen(*model, *stack->gpu(), stack->cache(), hasher, hit);
    CachedGenerator ssd_gen(*model, *ssd_stack->gpu(), ssd_stack->cache(), hasher, hit);
    // Pipelines compiled, scratch allocated, the GPU's clocks up, before the calibration learns
    // what a prefill costs: without this, the first process on a freshly started H200 host read
    // 14.9 ms for the uncached 8192-token prefill (14.5 on the GPU's own clock) against 3.2 in
    // the next process.
    must(warm_up([&] { return gen.generate(prompt, 1, false).status(); }));
    must(gen.calibrate(static_cast<size_t>(p)));
    must(ssd_gen.calibrate(static_cast<size_t>(p)));

    std::vector<float> reference;
    auto run = [&](CachedGenerator& g, bool use_cache, TinyCase& c) {
      const GpuTierMetrics& m = (&g == &gen ? stack : ssd_stack)->gpu()->metrics();
      const auto up0 = m.upload_seconds.snapshot();
      const uint64_t n0 = m.uploads.value(), d0 = m.direct_up.value(), r0 = m.copy_regions.value();
      // Every run on a GPU at work (BusyGpu), whatever came before it: the rows swung twofold
      // between processes without this.
      must(busy->run(busy_ms / 1000.0));
      // The first token's time, not the call's: publishing the computed blocks comes after it.
      Generation out = must(g.generate(prompt, 1, use_cache));
      const auto up1 = m.upload_seconds.snapshot();
      c.upload.push_back(up1.sum - up0.sum);
      c.upload_batches += up1.count - up0.count;
      c.uploaded += m.uploads.value() - n0;
      c.direct += m.direct_up.value() - d0;
      c.regions += m.copy_regions.value() - r0;
      c.ttft.push_back(out.first_token_seconds);
      c.restore.push_back(out.restore_seconds);
      c.prefill.push_back(out.prefill_seconds);
      // The first token's forward is the call's last one (one new token: no decode step).
      const ForwardTiming& t = model->last_timing();
      c.record.push_back(t.record_seconds);
      // A forward whose timestamps could not be read has no GPU time: left out, not counted as 0.
      if (t.gpu_seconds) c.gpu.push_back(*t.gpu_seconds);
      for (const auto& [name, seconds] : t.stages) {
        auto it = std::find_if(c.stages.begin(), c.stages.end(),
                               [&](const auto& st) { return st.first == name; });
        if (it == c.stages.end()) it = c.stages.insert(it, {name, {}});
        it->second.push_back(seconds);
      }
      c.cached_tokens = out.cached_tokens;
      c.predicted_load = out.plan.load_only;
      c.predicted_compute = out.plan.compute_only;
      // Each repetition's plan against what it got: a row's median hides a plan that changed.
      if (use_cache) {
        auto opt_ms = [](std::optional<double> v) { return v ? ms(*v) : std::string("?"); };
        const double overlap = (&g == &gen ? stack : ssd_stack)->cache().costs().overlap_factor();
        std::fprintf(stderr,
                     "tiny %d %s: plan load %s / compute %s / chosen %s ms (front beside load "
                     "alone %s, overlap "
                     "factor %.2f), cached %zu, restore %s, TTFT %s ms\n",
                     p, c.name.c_str(), opt_ms(out.plan.load_only).c_str(),
                     opt_ms(out.plan.compute_only).c_str(), opt_ms(out.plan.predicted).c_str(),
                     opt_ms(out.plan.overlap_alone).c_str(), overlap, out.cached_tokens,
                     ms(out.restore_seconds).c_str(), ms(out.first_token_seconds).c_str());
      }
      if (reference.empty()) reference = out.logits[0];
      c.identical = c.identical && out.logits[0] == reference;
    };
    std::vector<TinyCase> cases{TinyCase("not cached"), TinyCase("GPU"), TinyCase("RAM"),
                                TinyCase("SSD")};
    run(gen, false, cases[0]);  // the reference logits
    cases[0] = TinyCase("not cached");
    for (int r = 0; r < reps; ++r) run(gen, false, cases[0]);
    // Each cached case's first request is untimed, as the uncached one's: a tier's first restore
    // only warms the cost model up (hit_cost_model.h), so until the next one the plan has no
    // estimate and loads; what that costs is one request per tier in a process's life.
    must(gen.generate(prompt, 1, true).status());  // publishes the prompt's blocks
    // Its logits are still compared.
    auto untimed_first = [](TinyCase& c, int r) {
      if (r > 0) return;
      const bool same = c.identical;
      c = TinyCase(c.name);
      c.identical = same;
    };
    for (int r = 0; r <= reps; ++r) {
      run(gen, true, cases[1]);
      untimed_first(cases[1], r);
    }
    for (int r = 0; r <= reps; ++r) {
      must(stack->evict_gpu());
      run(gen, true, cases[2]);
      untimed_first(cases[2], r);
    }
    must(ssd_gen.generate(prompt, 1, true).status());
    for (int r = 0; r <= reps; ++r) {
      must(ssd_stack->evict_gpu());
      ssd_stack->ssd()->flush();
      run(ssd_gen, true, cases[3]);
      untimed_first(cases[3], r);
    }
    const double base = median(cases[0].ttft);
    for (const TinyCase& c : cases) {
      if (stage_report && (c.name == "GPU" || c.name == "not cached")) {
        for (const auto& [name, seconds] : c.stages) {
          stage_report->add_row({std::to_string(p), c.name, name, ms(median(seconds))});
        }
      }
      report.add_row({std::to_string(p), c.name, std::to_string(c.cached_tokens),
                      ms(median(c.ttft)), ms(median(c.restore)), ms(median(c.prefill)),
                      ms(median(c.record)), gpu_clock && !c.gpu.empty() ? ms(median(c.gpu)) : "-",
                      ms(median(c.upload)),
                      fmt_double(static_cast<double>(c.upload_batches) / reps, 1),
                      c.uploaded ? fmt_double(static_cast<double>(c.regions) / c.uploaded, 3) : "-",
                      c.uploaded ? fmt_double(100.0 * c.direct / c.uploaded, 0) : "-",
                      fmt_double(base / median(c.ttft), 2),
                      (c.predicted_load ? ms(*c.predicted_load) : "?") + " / " +
                          (c.predicted_compute ? ms(*c.predicted_compute) : "?"),
                      c.identical ? "yes" : "NO"});
    }
  }
}

double empty_batch_round_trip(VulkanContext& ctx) {
  std::vector<double> t;
  for (int i = 0; i < 51; ++i) {
    const auto t0 = Clock::now();
    CommandBatch b = must(CommandBatch::begin(ctx));
    must(b.submit_and_wait());
    t.push_back(seconds_since(t0));
  }
  return median(t);
}

std::vector<std::string> tiny_columns() {
  return {"prompt",        "prefix in",
          "cached tok",    "TTFT ms",
          "restore ms",    "prefill ms",
          "record ms",     "GPU ms",
          "upload ms",     "uploads",
          "regions/block", "direct %",
          "speedup",       "predicted load / compute ms",
          "same logits"};
}

}  // namespace kvtier::bench
