#include "bench/e2e/e2e_mixed.h"

#include <random>

#include "bench/e2e/e2e_support.h"
#include "cache/cache_stack.h"
#include "generate/cached_generator.h"

namespace kvtier::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kBlockSize = kE2eBlockSize;

}  // namespace

std::vector<std::string> mixed_columns() {
  return {"fetch",
          "prefixes on SSD",
          "decoding",
          "wall ms",
          "tokens/s",
          "first token, decoding ms",
          "first token, prefixed ms",
          "prefix joined at step"};
}

void bench_mixed(VulkanContext& ctx, const MixedBenchOptions& m, Report& report) {
  const int prefix = m.prefix, loaders = m.loaders, decoders = m.decoders,
            new_tokens = m.new_tokens;
  const int reps = m.reps;
  const std::string& dir = m.dir;
  const std::vector<std::string>& ssd_dirs = m.ssd_dirs;
  LlamaConfig config = LlamaConfig::tiny();
  config.max_positions = prefix + 64 + new_tokens;
  const LlamaWeights weights = LlamaWeights::synthetic(config);
  auto model = must(LlamaModel::create(ctx, config, weights));
  auto layout = std::make_shared<const KvLayout>(config.kv_layout(DType::kBF16, kBlockSize));
  const uint32_t per_loader = static_cast<uint32_t>((prefix + 16 + new_tokens) / kBlockSize + 1);
  CacheStackOptions o;
  o.layout = layout;
  o.vulkan = &ctx;
  o.gpu_pool.num_blocks = 2 * loaders * per_loader + decoders * 64 + 64;
  o.ram.capacity_bytes =
      layout->dense_block_bytes() * 3 / 2;  // what the GPU evicts goes to the SSD
  o.ssd.emplace();
  o.ssd->dir = dir + "/mixed";
  for (const std::string& d : ssd_dirs) o.ssd->dirs.push_back(d + "/mixed");
  if (!o.ssd->dirs.empty()) o.ssd->dir = o.ssd->dirs.front();
  o.ssd->reset = true;
  auto stack = must(CacheStack::open(o));
  PrefixHasher hasher(HashAlgorithm::kSha256, Namespace{"e2e-mixed", layout->fingerprint(), ""},
                      kBlockSize);
  // Loads, whatever a plan would choose: the table measures how loading prefixes and decoding
  // share the GPU (a cost plan may recompute a prefix on the SSD, and then nothing loads).
  HitOptions loads;
  loads.policy = HitPolicy::kLoad;
  CachedGenerator gen(*model, *stack->gpu(), stack->cache(), hasher, loads);
  // Each seed its own random sequence. A formula shifted by the seed gave only `vocab / gcd`
  // distinct prompts, so the "uncached" prompts of one repetition were blocks that an earlier one
  // had published and spilled: they were restored from the SSD too, in the asynchronous rows only.
  auto tokens = [&](int n, int seed) {
    std::mt19937_64 rng(static_cast<uint64_t>(seed));
    std::uniform_int_distribution<int32_t> pick(0, config.vocab - 1);
    std::vector<int32_t> t(n);
    for (int32_t& x : t) x = pick(rng);
    return t;
  };
  std::vector<std::vector<int32_t>> prefixes;
  for (int l = 0; l < loaders; ++l) {
    prefixes.push_back(tokens(prefix, 1000 + l));
    must(gen.generate(prefixes.back(), 1, true).status());  // publishes the prefix
  }
  must(stack->evict_gpu());
  stack->ssd()->flush();

  int seed = 0;
  for (const bool async : {false, true}) {
    std::vector<double> wall, joined, decoder_ttft, loader_ttft;
    for (int r = 0; r <= reps; ++r) {  // r == 0 warms up
      std::vector<std::vector<int32_t>> prompts;
      ++seed;
      for (int l = 0; l < loaders; ++l) {
        auto p = prefixes[l];
        auto tail = tokens(16, 50000 + seed * 16 + l);  // a new question after the cached prefix
        p.insert(p.end(), tail.begin(), tail.end());
        prompts.push_back(std::move(p));
      }
      for (int d = 0; d < decoders; ++d) prompts.push_back(tokens(128, 90000 + seed * 64 + d));
      const auto t0 = Clock::now();
      auto out = must(gen.generate_batch(prompts, new_tokens, true, async));
      const double t = seconds_since(t0);
      double steps = 0, loaders_first = 0, decoders_first = 0;
      for (int l = 0; l < loaders; ++l) {
        if (out[l].cached_tokens < static_cast<size_t>(prefix))
          die(internal_error("a prefix was not restored"));
        steps += out[l].joined_at_step;
        loaders_first = std::max(loaders_first, out[l].first_token_seconds);
      }
      for (int d = 0; d < decoders; ++d) {
        if (out[loaders + d].cached_tokens != 0)
          die(internal_error("a decoding prompt was found in the cache"));
        decoders_first = std::max(decoders_first, out[loaders + d].first_token_seconds);
      }
      if (r > 0) {
        wall.push_back(t);
        joined.push_back(steps / loaders);
        loader_ttft.push_back(loaders_first);
        decoder_ttft.push_back(decoders_first);
      }
      must(stack->evict_gpu());  // prefixes back to the SSD only
      stack->ssd()->flush();
    }
    const double tps = (loaders + decoders) * new_tokens / median(wall);
    report.add_row({async ? "asynchronous" : "synchronous",
                    std::to_string(loaders) + " x " + std::to_string(prefix),
                    std::to_string(decoders), ms(median(wall)), fmt_double(tps, 0),
                    decoders > 0 ? ms(median(decoder_ttft)) : "-", ms(median(loader_ttft)),
                    fmt_double(median(joined), 1)});
  }
  report.add_note(
      "Every sequence generates " + std::to_string(new_tokens) +
      " tokens; tokens/s counts all of them. "
      "synchronous: every prefix is fetched before the first step; asynchronous: "
      "TieredCache::fetch_async, a prefix's sequence joins the batch at the first step after its "
      "blocks are in (its median step in the last column). Decoding prompts are 128 new tokens "
      "each, "
      "none of them cached. first token: from the call's start to the last first token of the "
      "decoding prompts / of the prompts with a prefix on the SSD (median over repetitions).");
}

}  // namespace kvtier::bench
