#include "bench/e2e/e2e_hybrid.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "bench/e2e/e2e_support.h"
#include "bench/harness/gpu_launch_timing.h"
#include "cache/cache_stack.h"
#include "engine/model/llama_model.h"
#include "generate/hybrid_generator.h"

namespace kvtier::bench {
namespace {

constexpr int kBlockSize = kE2eBlockSize;

struct HybridCase {
  explicit HybridCase(std::string n) : name(std::move(n)) {}
  std::string name;
  std::vector<double> ttft, restore, prefill;
  size_t cached_tokens = 0;
  bool identical = true;  // first-token logits equal to the uncached run's, bit for bit
};

// A stack with the hybrid cache and generator over it.
struct HybridStack {
  std::unique_ptr<CacheStack> tiers;
  std::unique_ptr<HybridPrefixCache> cache;
  std::unique_ptr<HybridGenerator> gen;
  ~HybridStack() {
    gen.reset();
    cache.reset();  // stops listening before the tiers close
  }
};

}  // namespace

void bench_hybrid(VulkanContext& ctx, const std::vector<int>& prompts, int reps,
                  const std::string& dir, Report& report) {
  LlamaConfig config = LlamaConfig::tiny_hybrid();
  config.max_positions = *std::max_element(prompts.begin(), prompts.end()) + 64;
  auto model = must(LlamaModel::create(ctx, config, LlamaWeights::synthetic(config)));
  const HybridLayout hybrid = must(config.hybrid_layout(DType::kBF16, kBlockSize));
  auto layout = std::make_shared<const KvLayout>(hybrid.attention());
  auto states = must(GdnStatePool::create(ctx, config.gdn, config.gdn_layers(), 1));
  const PrefixHasher hasher(HashAlgorithm::kSha256,
                            Namespace{"e2e-hybrid", hybrid.fingerprint(), ""}, kBlockSize);
  for (int p : prompts) {
    const auto prompt = prompt_tokens(p, config.vocab);
    const uint32_t blocks = static_cast<uint32_t>(p / kBlockSize);
    // The SSD stack's RAM is too small for a snapshot: it is written to the SSD at once, and what
    // the GPU evicts follows it.
    const TinyStacks options = tiny_stacks(ctx, layout, blocks, 4 * hybrid.snapshot_bytes(),
                                           dir + "/hybrid-" + std::to_string(p));
    auto open = [&](const CacheStackOptions& o) {
      auto s = std::make_unique<HybridStack>();
      s->tiers = must(CacheStack::open(o));
      s->cache =
          must(HybridPrefixCache::create(s->tiers->cache(), hasher, hybrid, s->tiers->layouts()));
      s->gen = std::make_unique<HybridGenerator>(*model, *s->tiers->gpu(), *states, *s->cache);
      return s;
    };
    auto ram_stack = open(options.ram), ssd_stack = open(options.ssd);

    std::vector<float> reference;
    auto run = [&](HybridStack& s, bool use_cache, HybridCase& c) {
      Generation out = must(s.gen->generate(prompt, 1, use_cache));
      c.ttft.push_back(out.first_token_seconds);
      c.restore.push_back(out.restore_seconds);
      c.prefill.push_back(out.prefill_seconds);
      c.cached_tokens = out.cached_tokens;
      if (reference.empty()) reference = out.logits[0];
      c.identical = c.identical && out.logits[0] == reference;
    };
    std::vector<HybridCase> cases{HybridCase("not cached"), HybridCase("GPU"), HybridCase("RAM"),
                                  HybridCase("SSD")};
    run(*ram_stack, false, cases[0]);  // the reference logits
    cases[0] = HybridCase("not cached");
    // Pipelines compiled, scratch allocated, and the GPU itself warmed up: in a freshly started
    // H200 host's first seconds this table's first row read 51.2 ms where one forward's GPU stages
    // summed to 12.8 (bench/harness/gpu_launch_timing.h).
    must(warm_up([&] { return ram_stack->gen->generate(prompt, 1, false).status(); }));
    for (int r = 0; r < reps; ++r) run(*ram_stack, false, cases[0]);
    must(ram_stack->gen->generate(prompt, 1, true)
             .status());  // publishes the blocks and the snapshot
    for (int r = 0; r < reps; ++r) run(*ram_stack, true, cases[1]);
    for (int r = 0; r < reps; ++r) {
      must(ram_stack->tiers->evict_gpu());
      run(*ram_stack, true, cases[2]);
    }
    must(ssd_stack->gen->generate(prompt, 1, true).status());
    for (int r = 0; r < reps; ++r) {
      must(ssd_stack->tiers->evict_gpu());
      ssd_stack->tiers->ssd()->flush();
      run(*ssd_stack, true, cases[3]);
    }
    // Where an uncached prefill's GPU time goes (one forward, a timestamp after every stage).
    std::string stages;
    if (model->time_on_gpu(true, true).ok()) {
      must(ram_stack->gen->generate(prompt, 1, false).status());
      for (const auto& [name, seconds] : model->last_timing().stages) {
        stages += (stages.empty() ? "" : ", ") + name + " " + ms(seconds);
      }
      must(model->time_on_gpu(false));
    }
    if (!stages.empty())
      report.add_note(std::to_string(p) + " tokens not cached, GPU ms by stage: " + stages);
    const double base = median(cases[0].ttft);
    for (const HybridCase& c : cases) {
      const double per_token = c.cached_tokens ? 1.0 / static_cast<double>(c.cached_tokens) : 0.0;
      report.add_row(
          {std::to_string(p), c.name, std::to_string(c.cached_tokens), ms(median(c.ttft)),
           ms(median(c.restore)), ms(median(c.prefill)), fmt_double(base / median(c.ttft), 2),
           fmt_double(static_cast<double>(layout->dense_block_bytes()) / kBlockSize, 0),
           c.cached_tokens ? fmt_double(static_cast<double>(hybrid.snapshot_bytes()) * per_token, 0)
                           : "-",
           c.identical ? "yes" : "NO"});
    }
  }
}

std::vector<std::string> hybrid_columns() {
  return {"prompt",  "prefix in",  "cached tok",           "TTFT ms",    "restore ms", "prefill ms",
          "speedup", "KV B/token", "state B/cached token", "same logits"};
}

}  // namespace kvtier::bench
