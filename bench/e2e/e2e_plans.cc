#include "bench/e2e/e2e_plans.h"

#include <algorithm>
#include <iostream>
#include <sstream>
#include <thread>

#include "base/metrics/metrics_exporters.h"
#include "bench/e2e/busy_gpu.h"
#include "bench/e2e/e2e_support.h"
#include "bench/harness/gpu_launch_timing.h"
#include "cache/cache_stack.h"
#include "generate/cached_generator.h"

namespace kvtier::bench {
namespace {

constexpr int kBlockSize = kE2eBlockSize;

// TTFT of one way to bring the prefix in, and what it did.
struct Measured {
  double ttft = 0;
  double restore = 0, prefill = 0;  // medians: the host's work before the forward, the forward
  size_t recomputed = 0;  // cached blocks computed instead of loaded (the last repetition's)
  bool deadline = false;  // a load was given up at its deadline in some repetition
  bool identical = true;  // first-token logits equal the uncached run's in every repetition
  size_t fewest_cached_tokens = ~size_t{0};  // restored, in the repetition that restored least
  // The last repetition asked only the GPU tier (Generation::looked_up_gpu_only).
  bool gpu_only = false;
  HitPlan plan;  // the last repetition's, with the cost model's predictions
};

// The cache's drop, corruption and failure counters that are not zero: why a row's logits differed.
std::string nonzero_failures(TieredCache& cache) {
  PrometheusTextWriter w;
  cache.visit_metrics(w);
  std::istringstream in(w.text());
  std::string line, out;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#' || line.ends_with(" 0")) continue;
    if (line.find("drop") != std::string::npos || line.find("corrupt") != std::string::npos ||
        line.find("fail") != std::string::npos || line.find("gone") != std::string::npos) {
      out += "    " + line + "\n";
    }
  }
  return out;
}

}  // namespace

std::vector<std::string> plan_columns() {
  return {"model",
          "prompt",
          "prefix in",
          "uncached ms",
          "load-only ms",
          "plan ms (s)",
          "best sweep ms (s)",
          "plan / min",
          "plan / best",
          "predicted load / compute ms",
          "probe ms",
          "plan restore + prefill ms (uncached prefill)",
          "same logits"};
}

void bench_plans(VulkanContext& ctx, const PlanBenchOptions& o, Report& report) {
  LlamaConfig config = o.config;
  config.max_positions = *std::max_element(o.prompts.begin(), o.prompts.end()) + 64;
  const LlamaWeights weights = LlamaWeights::synthetic(config);
  auto model = must(LlamaModel::create(ctx, config, weights));
  auto layout = std::make_shared<const KvLayout>(config.kv_layout(DType::kBF16, kBlockSize));
  auto busy = must(BusyGpu::create(ctx, *model, layout));
  for (int p : o.prompts) {
    const std::vector<int32_t> prompt = prompt_tokens(p, config.vocab);
    const size_t n = static_cast<size_t>(
        (p - 1) / kBlockSize);  // the cached prefix: all but the last token's block
    for (const bool from_ssd : {false, true}) {
      CacheStackOptions so;
      so.layout = layout;
      so.vulkan = &ctx;
      so.gpu_pool.num_blocks =
          static_cast<uint32_t>(3 * (p / kBlockSize) + 64);  // computed + loaded copies
      so.ram.capacity_bytes = (n + 16) * (layout->dense_block_bytes() + 4096);
      if (from_ssd) {
        so.ram.capacity_bytes = layout->dense_block_bytes() * 3 / 2;
        so.ssd.emplace();
        so.ssd->dir = o.dir + "/plans-" + o.model_name + "-" + std::to_string(p);
        so.ssd->reset = true;
        so.ssd->capacity_bytes =
            std::max<uint64_t>(4 * n * layout->dense_block_bytes(), 1ull << 30);
      }
      auto stack = must(CacheStack::open(so));
      PrefixHasher hasher(HashAlgorithm::kSha256, Namespace{"plans", layout->fingerprint(), ""},
                          kBlockSize);
      CachedGenerator gen(*model, *stack->gpu(), stack->cache(), hasher);
      // The GPU warmed up before the cost model's calibration and the first row: on a freshly
      // started H200 host a forward ran 3-10x slower for seconds, the calibration learnt that, and
      // the first row planned against it (bench/harness/gpu_launch_timing.h).
      must(warm_up([&] { return gen.generate(prompt, 1, false).status(); }));
      must(gen.calibrate(std::min<size_t>(p, 8192)));

      std::vector<float> reference;
      auto run = [&](bool use_cache, const HitOptions& hit) {
        if (use_cache) {
          must(stack->evict_gpu());
          if (stack->ssd()) stack->ssd()->flush();
        }
        // Every run starts from the same GPU state: a hit's run came right after the eviction and
        // the SSD's flush (milliseconds without GPU work), the uncached runs back to back, and an
        // idle GPU wakes up slowly (on the H200 host, tiny model: an 8192-token forward after 30
        // ms idle took 0.15-0.2 ms longer; a 16-token one after a RAM load and 200 ms idle 2.86
        // ms, against 0.96 after 20 ms). So every run follows the same pause, then the same
        // stretch of other forwards, as a server under load would be.
        if (o.pause_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o.pause_ms));
        must(busy->run(o.busy_ms / 1000.0));
        gen.hit_options() = hit;
        Generation out = must(gen.generate(prompt, 1, use_cache));
        if (reference.empty()) reference = out.logits[0];
        return out;
      };
      auto measure = [&](bool use_cache, const HitOptions& hit) {
        Measured m;
        std::vector<double> t, restore, prefill;
        for (int r = 0; r < o.reps; ++r) {
          const Generation out = run(use_cache, hit);
          m.plan = out.plan;
          m.gpu_only = out.looked_up_gpu_only;
          m.fewest_cached_tokens = std::min(m.fewest_cached_tokens, out.cached_tokens);
          // The first token's time, not the call's: publishing the computed blocks comes after it.
          t.push_back(out.first_token_seconds);
          restore.push_back(out.restore_seconds);
          prefill.push_back(out.prefill_seconds);
          m.recomputed = out.recomputed_blocks;
          m.deadline = m.deadline || out.load_deadline_passed;
          m.identical = m.identical && out.logits[0] == reference;
        }
        m.ttft = median(t);
        m.restore = median(restore);
        m.prefill = median(prefill);
        return m;
      };
      run(false, {});  // warm-up, and the reference logits
      const Measured uncached = measure(false, {});
      must(gen.generate(prompt, 1, true).status());  // publishes the prefix
      HitOptions load{HitPolicy::kLoad, std::nullopt, 0, {}};
      const Measured load_only = measure(true, load);
      Measured best;
      size_t best_s = 0;
      std::vector<bool> sweep_identical;
      for (int k = 0; k < o.sweep_points; ++k) {
        const size_t s =
            n * static_cast<size_t>(k) / static_cast<size_t>(std::max(1, o.sweep_points - 1));
        const Measured m =
            measure(true, HitOptions{HitPolicy::kCost, s, o.sweep_deadline_factor, {}});
        sweep_identical.push_back(m.identical);
        if (!m.identical) {
          std::cerr << o.model_name << " " << p << (from_ssd ? " SSD" : " RAM") << ": split " << s
                    << (m.deadline ? " (deadline)" : "")
                    << " gave other logits; fewest tokens restored " << m.fewest_cached_tokens
                    << " of " << n * kBlockSize << "\n"
                    << nonzero_failures(stack->cache());
        }
        if (k == 0 || m.ttft < best.ttft) {
          best = m;
          best_s = s;
        }
      }
      const Measured plan = measure(true, HitOptions{});  // the default: cost, with a deadline
      // What a probe costs its request where the plan computes: every cached block loaded to time
      // the tiers again, waited for no longer than the predicted recompute
      // (HitOptions::probe_after; here every plan that computes probes). After the plan's row,
      // whose estimates it changes.
      HitOptions probing;
      probing.probe_after = 1;
      const Measured probe = measure(true, probing);
      const double floor = std::min(uncached.ttft, load_only.ttft);
      bool sweep_same = true;
      for (const bool b : sweep_identical) sweep_same = sweep_same && b;
      const bool same = uncached.identical && load_only.identical && sweep_same && plan.identical &&
                        probe.identical;
      report.add_row(
          {o.model_name, std::to_string(p), from_ssd ? "SSD" : "RAM", ms(uncached.ttft),
           ms(load_only.ttft),
           ms(plan.ttft) + " (" +
               (plan.gpu_only ? "not looked up" : std::to_string(plan.recomputed)) +
               (plan.deadline ? ", deadline" : "") + ")",
           ms(best.ttft) + " (" + std::to_string(best_s) + ")", fmt_double(plan.ttft / floor, 2),
           fmt_double(plan.ttft / best.ttft, 2),
           (plan.plan.load_only ? ms(*plan.plan.load_only) : "?") + " / " +
               (plan.plan.compute_only ? ms(*plan.plan.compute_only) : "?"),
           ms(probe.ttft) + (!probe.plan.probe ? " (no probe)"
                             : probe.deadline  ? " (deadline)"
                                               : " (loaded)"),
           ms(plan.restore) + " + " + ms(plan.prefill) + " (" + ms(uncached.prefill) + ")",
           same ? "yes" : "NO"});
    }
  }
}

}  // namespace kvtier::bench
