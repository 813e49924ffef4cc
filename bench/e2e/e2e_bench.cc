// e2e_bench: time to first token when a prompt's prefix is not cached, or cached on the GPU, in
// RAM, or on the SSD.
//  * Tiny Llama on the engine (4 layers, 8/2 heads, head_dim 64, BF16 KV): the whole
//    CachedGenerator path, restore plus the rest of the prefill, against its own full prefill.
//  * A Llama-3-8B-shaped KV layout (32 layers, 8 KV heads, head_dim 128, BF16; KV shapes only, no
//    weights): the restore path (hash, look up, read, upload, scatter into GPU blocks) against a
//    lower bound on that model's prefill, 2 x 8e9 x tokens FLOPs at the bf16 matmul rate measured
//    in this run (PyTorch on a CUDA GPU; elsewhere our own f32 Vulkan matmul, said in the notes).
// Medians of repetitions; tables on stdout, rows in e2e_bench_tiny.json / e2e_bench_8b.json, and
// bench/plot_e2e.py draws e2e_bench.png from them.
#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <future>
#include <iostream>
#include <random>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "base/byte_size.h"
#include "base/log.h"
#include "base/memory/memory_policy.h"
#include "bench/e2e/e2e_hybrid.h"
#include "bench/e2e/e2e_mixed.h"
#include "bench/e2e/e2e_plans.h"
#include "bench/e2e/e2e_prefill.h"
#include "bench/e2e/e2e_support.h"
#include "bench/e2e/e2e_tiny.h"
#include "bench/harness/bench_report.h"
#include "cache/cache_stack.h"
#include "generate/cached_generator.h"
#include "tests/support/temp_dir.h"
#include "tests/support/test_blocks.h"
#include "tiers/ssd/io/io_uring_ring.h"

using namespace kvtier;
using namespace kvtier::bench;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kBlockSize = kE2eBlockSize;

// ---- the bf16 matmul rate -------------------------------------------------------------------

struct MatmulRate {
  double tflops = 0;
  std::string source;
};

MatmulRate matmul_rate_from_pytorch(const std::string& script) {
  FILE* p = ::popen(("python3 " + script + " 2>/dev/null").c_str(), "r");
  if (!p) return {};
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  if (::pclose(p) != 0) return {};
  auto j = nlohmann::json::parse(out, nullptr, false);
  if (j.is_discarded() || !j.contains("bf16_matmul_tflops")) return {};
  return {j["bf16_matmul_tflops"].get<double>(),
          "PyTorch bf16 matmul 8192^3 on " + j.value("device", std::string("?"))};
}

struct MatmulParams {
  uint64_t x, w, y;
  uint32_t rows, k, n, accumulate;
};

// Our f32 Vulkan matmul (the tiny model's), n^3: where there is no PyTorch GPU (lavapipe).
MatmulRate matmul_rate_from_vulkan(VulkanContext& ctx) {
  const uint32_t n = 1024;
  const uint64_t bytes = uint64_t{n} * n * 4;
  GpuBuffer x = must(GpuBuffer::create(ctx, bytes, MemoryKind::kDevice));
  GpuBuffer w = must(GpuBuffer::create(ctx, bytes, MemoryKind::kDevice));
  GpuBuffer y = must(GpuBuffer::create(ctx, bytes, MemoryKind::kDevice));
  auto p = must(ctx.pipeline("matmul", {}, sizeof(MatmulParams)));
  std::vector<double> samples;
  for (int r = 0; r < 4; ++r) {
    CommandBatch b = must(CommandBatch::begin(ctx));
    b.dispatch(*p, MatmulParams{x.address(), w.address(), y.address(), n, n, n, 0}, n / 256, n / 4);
    const auto t0 = Clock::now();
    must(b.submit_and_wait());
    if (r > 0) samples.push_back(seconds_since(t0));  // the first compiles and warms
  }
  return {2.0 * n * n * n / median(samples) / 1e12,
          "no PyTorch GPU here: kvtier's f32 Vulkan matmul 1024^3 on " + ctx.info().name +
              " stands in for a bf16 matmul"};
}

// ---- ceilings measured in the same run ----------------------------------------------------------

// Host-to-device bandwidth: a Vulkan copy from host-visible memory (what a RAM hit's upload can
// reach at best). `bytes` per copy, median of 5 after a warm-up.
double h2d_copy_gbps(VulkanContext& ctx, uint64_t bytes) {
  GpuBuffer host = must(GpuBuffer::create(ctx, bytes, MemoryKind::kUpload));
  GpuBuffer device = must(GpuBuffer::create(ctx, bytes, MemoryKind::kDevice));
  std::memset(host.mapped(), 0x5a, bytes);
  std::vector<double> samples;
  for (int r = 0; r < 6; ++r) {
    CommandBatch b = must(CommandBatch::begin(ctx));
    b.copy(host, 0, device, 0, bytes);
    const auto t0 = Clock::now();
    must(b.submit_and_wait());
    if (r > 0) samples.push_back(seconds_since(t0));
  }
  return bytes / median(samples) / 1e9;
}

// The disks' sequential read of what the SSD tier wrote (each segment file up to its watermark:
// the preallocated rest reads as zeros without touching the disk), O_DIRECT in 4 MiB reads, 32 in
// flight per directory through io_uring, the directories at once (a thread each): what an SSD hit
// can reach at best here. Median of 3.
double disk_read_gbps(StripedSsdTier& ssd) {
  using Extent = std::pair<std::string, uint64_t>;
  std::vector<std::vector<Extent>> dirs;
  for (SsdTier* d : ssd.directories()) {
    dirs.emplace_back();
    for (const SegmentRecord& rec : d->state_for_testing().segments.records()) {
      dirs.back().emplace_back(d->state_for_testing().segment_path(rec.id), rec.watermark);
    }
  }
  auto read_dir = [](const std::vector<Extent>& extents) -> uint64_t {
    auto ring = must(IoUringRing::create(64));
    constexpr uint64_t kChunk = 4 << 20;
    constexpr size_t kDepth = 32;
    std::vector<AlignedBuffer> buffers;
    for (size_t i = 0; i < kDepth; ++i) buffers.emplace_back(kChunk, 4096, false);
    uint64_t total = 0;
    for (const auto& [path, size] : extents) {
      UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC));
      if (!fd.valid()) die(errno_status("open " + path, errno));
      for (uint64_t at = 0; at < size; at += kChunk * kDepth) {
        std::vector<IoOp> ops;
        for (size_t k = 0; k < kDepth && at + k * kChunk < size; ++k) {
          ops.push_back(IoOp::read(fd.get(), buffers[k].data(),
                                   std::min(kChunk, size - at - k * kChunk), at + k * kChunk));
        }
        must(run_io_batch(*ring, ops));
        for (const IoOp& op : ops) total += op.done;
      }
    }
    return total;
  };
  std::vector<double> samples;
  for (int r = 0; r < 3; ++r) {
    const auto t0 = Clock::now();
    std::vector<std::future<uint64_t>> each;
    for (const auto& d : dirs)
      each.push_back(std::async(std::launch::async, read_dir, std::cref(d)));
    uint64_t total = 0;
    for (auto& f : each) total += f.get();
    samples.push_back(total / seconds_since(t0) / 1e9);
  }
  return median(samples);
}

// ---- Llama-3-8B-shaped KV: the restore path against the prefill bound -------------------------

void bench_8b(VulkanContext& ctx, const std::vector<int>& prompts, int reps, const std::string& dir,
              const MatmulRate& rate, const std::vector<std::string>& ssd_dirs, Report& report) {
  auto layout = std::make_shared<const KvLayout>(must(layout_preset("llama-3-8b")));
  const uint64_t block_bytes = layout->dense_block_bytes();
  const Block pattern = testing::make_block(layout, 1, testing::Values::kKvLike);
  for (int p : prompts) {
    const uint32_t n = static_cast<uint32_t>(p / kBlockSize);
    const auto tokens32 = prompt_tokens(p, 128256);
    const std::vector<uint32_t> tokens(tokens32.begin(), tokens32.end());
    PrefixHasher hasher(HashAlgorithm::kSha256, Namespace{"e2e-8b", layout->fingerprint(), ""},
                        kBlockSize);
    const auto keys = hasher.keys(tokens, {});
    std::vector<BlockRef> blocks;
    for (uint32_t i = 0; i < n; ++i) {
      Block b = pattern.clone();
      b.mutable_identity() = hasher.identity(keys, i, {});
      blocks.push_back(std::make_shared<const Block>(std::move(b)));
    }
    CacheStackOptions o;
    o.layout = layout;
    o.vulkan = &ctx;
    o.gpu_pool.num_blocks = n + 8;
    o.ram.capacity_bytes = (n + 8) * (block_bytes + 4096);
    o.ssd.emplace();
    o.ssd->dir = dir + "/8b-" + std::to_string(p);
    for (const std::string& d : ssd_dirs) o.ssd->dirs.push_back(d + "/8b-" + std::to_string(p));
    if (!o.ssd->dirs.empty()) o.ssd->dir = o.ssd->dirs.front();
    o.ssd->reset = true;
    o.ssd->capacity_bytes = std::max<uint64_t>(4 * n * block_bytes, 2ull << 30);
    auto stack = must(CacheStack::open(o));
    // The spill queue holds 512 MiB; an 8k prompt is 1 GiB of KV, so write it in slices.
    const uint32_t slice = static_cast<uint32_t>(o.ssd->spill_queue_bytes / 2 / block_bytes);
    for (uint32_t i = 0; i < n; ++i) {
      must(stack->ram().insert(blocks[i]).status());
      must(stack->ssd()->insert(blocks[i]).status());
      if ((i + 1) % slice == 0) stack->ssd()->flush();
    }
    stack->ssd()->flush();

    // tier 0: blocks stay on the GPU; 1: dropped from the GPU, read from RAM; 2: dropped from
    // GPU and RAM, read from the SSD.
    const double bound = 2 * 8e9 * p / (rate.tflops * 1e12);
    const char* names[] = {"GPU", "RAM", "SSD"};
    // What each row could reach at best, measured now: the bus for RAM, the disk for the SSD.
    const double h2d = h2d_copy_gbps(ctx, std::min<uint64_t>(n * block_bytes, 1ull << 30));
    const double disk = disk_read_gbps(*stack->ssd());
    for (int tier = 0; tier < 3; ++tier) {
      if (tier == 2) {
        for (const BlockRef& b : blocks) stack->ram().erase(b->hash());
      }
      std::vector<double> samples;
      for (int r = 0; r <= reps; ++r) {  // r == 0 warms up (and, for tier 0, uploads)
        if (tier > 0) {
          for (const BlockRef& b : blocks) stack->gpu()->erase(b->hash());
        }
        const auto t0 = Clock::now();
        const auto k = hasher.keys(tokens, {});
        PinnedBlocks got = stack->cache().fetch(k);
        const double s = seconds_since(t0);
        if (got.size() != n)
          die(internal_error("restored " + std::to_string(got.size()) + " of " +
                             std::to_string(n)));
        if (r > 0) {
          if (got.entries().front().source_tier != tier)
            die(internal_error("restored from the wrong tier"));
          samples.push_back(s);
        }
      }
      const double t = median(samples);
      const double gbps = n * block_bytes / t / 1e9;
      const std::string ceiling = tier == 1   ? fmt_double(h2d, 2) + " bus"
                                  : tier == 2 ? fmt_double(disk, 2) + " disk"
                                              : "-";
      const std::string of = tier == 1   ? fmt_double(gbps / h2d, 2)
                             : tier == 2 ? fmt_double(gbps / disk, 2)
                                         : "-";
      report.add_row({std::to_string(p), names[tier], format_byte_size(n * block_bytes), ms(t),
                      fmt_double(gbps, 2), ceiling, of, ms(bound), fmt_double(t / bound, 3)});
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  // A crash on the GPU host (no debugger there) prints its return addresses, for addr2line here.
  ::signal(SIGSEGV, [](int) {
    void* frames[64];
    const int n = backtrace(frames, 64);
    backtrace_symbols_fd(frames, n, 2);
    std::_Exit(139);
  });
  CLI::App app{"e2e_bench: time to first token with the prefix restored from each tier"};
  std::vector<int> prompts = {2048, 8192};
  int reps = 5;
  std::string dir;
  bool skip_tiny = false, skip_8b = false;
  double matmul_tflops = 0;
  std::string matmul_script = std::filesystem::exists(KVTIER_BENCH_SOURCE_DIR "/matmul_rate.py")
                                  ? KVTIER_BENCH_SOURCE_DIR "/matmul_rate.py"
                                  : "bench/matmul_rate.py";
  app.add_option("--prompts", prompts, "Prompt lengths in tokens (multiples of 16)")
      ->delimiter(',');
  std::vector<std::string> engine_models = {"auto"};
  app.add_option("--engine-models", engine_models,
                 "Models of the engine-vs-PyTorch prefill table: tiny, 1b (none: skip it; auto: "
                 "both on a GPU "
                 "with tensor cores, none elsewhere)")
      ->delimiter(',')
      ->capture_default_str();
  std::string torch_script =
      std::filesystem::exists(KVTIER_BENCH_SOURCE_DIR "/torch_prefill_reference.py")
          ? KVTIER_BENCH_SOURCE_DIR "/torch_prefill_reference.py"
          : "bench/torch_prefill_reference.py";
  app.add_option("--torch-script", torch_script,
                 "PyTorch's prefill of the same models (empty: no PyTorch column)");
  app.add_option("--reps", reps);
  app.add_option("--dir", dir, "Where the SSD tiers live (default: a temporary directory)");
  app.add_flag("--skip-tiny", skip_tiny);
  app.add_flag("--skip-8b", skip_8b);
  bool skip_mixed = false, skip_hybrid = false;
  bool profile_stages = false;
  int mixed_prefix = 8192, mixed_loaders = 2, mixed_decoders = 6, mixed_tokens = 64;
  std::vector<std::string> ssd_dirs;
  app.add_flag("--skip-mixed", skip_mixed);
  app.add_flag("--skip-hybrid", skip_hybrid);
  app.add_flag("--profile-stages", profile_stages,
               "Tiny and engine tables: time the first token's forward stage by stage on the GPU");
  app.add_option("--mixed-prefix", mixed_prefix, "Mixed load: tokens of each prefix on the SSD");
  app.add_option("--mixed-loaders", mixed_loaders,
                 "Mixed load: prompts whose prefix is on the SSD");
  app.add_option("--mixed-decoders", mixed_decoders,
                 "Mixed load: uncached prompts decoding meanwhile");
  app.add_option("--mixed-tokens", mixed_tokens, "Mixed load: tokens each sequence generates");
  app.add_option("--ssd-dirs", ssd_dirs,
                 "SSD tier directories for the 8B and mixed runs (default: one under --dir)")
      ->delimiter(',');
  app.add_option("--matmul-tflops", matmul_tflops, "Use this bf16 rate instead of measuring one");
  app.add_option("--matmul-script", matmul_script);
  std::string hit_policy = "cost";
  app.add_option("--hit-policy", hit_policy,
                 "How the tiny table's hits reach the GPU: cost (plan), load, compute")
      ->capture_default_str();
  std::vector<std::string> plan_models = {"tiny"};
  int sweep_points = 9;
  app.add_option("--plan-models", plan_models,
                 "Models of the hit-plan table: tiny, 1b (none: skip it)")
      ->delimiter(',');
  app.add_option("--sweep-points", sweep_points, "Hit-plan table: splits tried per row");
  double sweep_deadline = 0;
  app.add_option("--sweep-deadline", sweep_deadline,
                 "Hit-plan table: give the sweep's loads up after this multiple of their predicted "
                 "time (0: never)");
  int plan_pause_ms = 0, plan_busy_ms = 30;
  app.add_option("--plan-pause-ms", plan_pause_ms,
                 "Hit-plan table: idle milliseconds before every run")
      ->capture_default_str();
  app.add_option("--plan-busy-ms", plan_busy_ms,
                 "Hit-plan table: then milliseconds of other forwards, so every run starts on a "
                 "GPU at work")
      ->capture_default_str();
  bool prefill_switch = true;
  app.add_option("--prefill-switch", prefill_switch,
                 "Prefill table: an untimed empty batch between PyTorch's forward and ours, so the "
                 "GPU's switch from PyTorch's process is not timed as ours")
      ->capture_default_str();
  int tiny_busy_ms = 30;
  app.add_option(
         "--tiny-busy-ms", tiny_busy_ms,
         "Tiny table: milliseconds of other forwards before every timed run, so each starts "
         "on a GPU at work")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  const HitPolicy policy = must(parse_hit_policy(hit_policy));
  for (int p : prompts) {
    if (p < 2 * kBlockSize || p % kBlockSize)
      die(invalid_argument("prompt lengths must be multiples of 16, >= 32"));
  }
  init_logging("warn");
  keep_freed_block_memory();  // as kvtierd does
  auto ctx = must(VulkanContext::create());
  std::unique_ptr<testing::TempDir> tmp;
  if (dir.empty()) {
    tmp = std::make_unique<testing::TempDir>();
    dir = tmp->str();
  }
  std::cout << "machine: " << machine_description() << "\nvulkan: " << ctx->info().name << "\n\n";

  if (engine_models == std::vector<std::string>{"auto"}) {
    // On lavapipe a 32k-token forward of the 1B shape would take hours, and there is no PyTorch
    // GPU to compare with.
    engine_models = ctx->info().coopmat_f16 ? std::vector<std::string>{"tiny", "1b"}
                                            : std::vector<std::string>{};
    if (engine_models.empty())
      std::cout << "engine table skipped: no tensor cores (--engine-models tiny runs it)\n\n";
  }
  engine_models.erase(std::remove(engine_models.begin(), engine_models.end(), "none"),
                      engine_models.end());
  for (const std::string& m : engine_models) {
    if (m != "tiny" && m != "1b")
      die(invalid_argument("--engine-models: '" + m + "' is not tiny or 1b"));
  }
  if (!engine_models.empty()) {
    Report r("e2e, the engine's uncached prefill against PyTorch eager on the same GPU",
             prefill_columns());
    Report stages("e2e, where the engine's uncached prefill goes (GPU clock, summed over layers)",
                  {"model", "prompt", "stage", "GPU ms", "share"});
    bench_prefill(*ctx,
                  PrefillBenchOptions{engine_models, prompts, reps, torch_script, prefill_switch},
                  r, profile_stages ? &stages : nullptr);
    if (profile_stages) {
      stages.print();
      stages.write_json(output_path("e2e_bench_prefill_stages.json"));
    }
    r.add_note(
        "engine ms: one forward of the whole prompt (KV written to the paged cache, the last row's "
        "logits "
        "read back), host wall time; GPU ms: its GPU timestamps; host record ms: the part of the "
        "wall time spent recording the forward's launches before its last submission (the first "
        "layer runs meanwhile); host setup / to 1st submit / readback / rest: before "
        "recording (checks, metadata, pipelines), recording up to the first submission (the GPU "
        "idle until then), after the wait (timestamps, logits), and the call's time outside "
        "those, the recording and the wait (freeing its batches). PyTorch eager: "
        "bench/torch_prefill_reference.py --serve, same shapes, bf16 weights, flash SDPA, CUDA "
        "events (3 untimed forwards before each). Medians of " +
        std::to_string(reps) +
        " rounds, each PyTorch's forward then ours, after the engine's warm-up forwards (10 s "
        "before the first row, 0.25 s before the others); engine / PyTorch: the median of the "
        "rounds' ratios [their range].");
    r.set_meta("vulkan", ctx->info().name);
    r.print();
    r.write_json(output_path("e2e_bench_prefill.json"));
  }

  if (!skip_tiny) {
    Report r("e2e, tiny Llama (BF16 KV): time to first token", tiny_columns());
    Report stages(
        "e2e, tiny Llama: where the first token's forward goes (GPU clock, summed over layers)",
        {"prompt", "prefix in", "stage", "GPU ms"});
    bench_tiny(*ctx, prompts, reps, tiny_busy_ms, dir, policy, r,
               profile_stages ? &stages : nullptr);
    if (profile_stages) {
      stages.add_note(
          "A timestamp after each stage's launches and barrier; medians over repetitions.");
      stages.print();
      stages.write_json(output_path("e2e_bench_tiny_stages.json"));
    }
    r.add_note(
        "speedup: TTFT not cached / TTFT; restore = hash + lookup + fetch into GPU blocks; prefill "
        "= "
        "the rest of the prompt through the model, of which 'record' recorded its launches and "
        "'GPU' "
        "is the GPU's own clock over them; upload = the GPU tier's upload batches (host to GPU, "
        "copy and scatter, submit to done), uploads = batches per request, regions/block = copy "
        "regions per uploaded block (side-by-side blocks share one), direct = blocks the GPU "
        "copied "
        "from where they lie in RAM. predicted = the last repetition's plan: a pure load / a "
        "recompute (stderr has every "
        "repetition's). 'same logits': first-token logits bit-identical "
        "to the uncached run's.");
    r.set_meta("empty_batch_round_trip_us", fmt_double(empty_batch_round_trip(*ctx) * 1e6, 1));
    r.set_meta("vulkan", ctx->info().name);
    r.set_meta("hit_policy", hit_policy_name(policy));
    // The model takes the device's default path; the tensor-core and scalar runs give different
    // TTFTs, and KVTIER_VK_COOPMAT=0 runs write the same file.
    r.set_meta("attention",
               PagedAttentionVarlen::path_name(PagedAttentionVarlen::default_path(*ctx)));
    r.print();
    r.write_json(output_path("e2e_bench_tiny.json"));
  }
  if (!skip_hybrid) {
    Report r(
        "e2e, tiny hybrid (6 Gated DeltaNet + 2 attention layers, BF16 KV, f32 state): time to "
        "first token",
        hybrid_columns());
    bench_hybrid(*ctx, prompts, reps, dir, r);
    r.add_note(
        "A hybrid prefix is restored only to its last block with a state snapshot (here: the "
        "prompt's "
        "last full block). GPU: KV blocks on the GPU, the snapshot from RAM (the GPU tier holds KV "
        "only); "
        "RAM: both from RAM; SSD: both from the SSD. restore = hash + lookup + fetch of the blocks "
        "and "
        "the snapshot into the GPU and the state slot; prefill = the rest of the prompt. KV "
        "B/token: the "
        "attention layers' KV per token; state B/cached token: one snapshot over the tokens it "
        "restores. "
        "'same logits': first-token logits bit-identical to the uncached run's.");
    r.set_meta("vulkan", ctx->info().name);
    r.print();
    r.write_json(output_path("e2e_bench_hybrid.json"));
  }
  for (const std::string& m : plan_models) {
    if (m == "none") continue;
    if (m != "tiny" && m != "1b")
      die(invalid_argument("--plan-models: '" + m + "' is not tiny or 1b"));
    PlanBenchOptions po{m,
                        m == "1b" ? LlamaConfig::llama_1b_shaped() : LlamaConfig::tiny(),
                        prompts,
                        reps,
                        sweep_points,
                        dir,
                        sweep_deadline,
                        plan_pause_ms,
                        plan_busy_ms};
    Report r("e2e, " + m + " Llama (BF16 KV), whole prefix cached: TTFT by how it reaches the GPU",
             plan_columns());
    bench_plans(*ctx, po, r);
    r.add_note(
        "uncached: the whole prompt computed. load-only: every cached block loaded (compute only "
        "the last "
        "block's tokens). plan: the cost model's split (default policy, with its deadline); (s) = "
        "cached "
        "blocks computed, ', deadline' if a load was given up. best sweep: the fastest of " +
        std::to_string(sweep_points) +
        " forced splits, (s) its computed blocks. plan / min = plan over "
        "min(uncached, load-only); plan / best = plan over the best sweep. same logits: every "
        "run's "
        "first-token logits bit-identical to the uncached run's. Medians of " +
        std::to_string(reps) + ".");
    r.set_meta("vulkan", ctx->info().name);
    r.print();
    r.write_json(output_path("e2e_bench_plans_" + m + ".json"));
  }
  if (!skip_mixed) {
    Report r("e2e, tiny Llama: decoding while other prefixes load from the SSD", mixed_columns());
    bench_mixed(*ctx,
                MixedBenchOptions{mixed_prefix, mixed_loaders, mixed_decoders, mixed_tokens, reps,
                                  dir, ssd_dirs},
                r);
    r.print();
    r.write_json(output_path("e2e_bench_mixed.json"));
  }
  if (!skip_8b) {
    MatmulRate rate = matmul_tflops > 0 ? MatmulRate{matmul_tflops, "given on the command line"}
                                        : matmul_rate_from_pytorch(matmul_script);
    if (rate.tflops <= 0) rate = matmul_rate_from_vulkan(*ctx);
    Report r("e2e, Llama-3-8B-shaped KV (BF16, 2 MiB blocks): restore vs prefill lower bound",
             {"prompt", "prefix in", "KV bytes", "restore ms", "GB/s", "ceiling GB/s", "of ceiling",
              "prefill bound ms", "restore/bound"});
    bench_8b(*ctx, prompts, reps, dir, rate, ssd_dirs, r);
    r.add_note(
        "ceiling, measured in this run: for RAM a Vulkan copy from host-visible to device memory "
        "(the bus); for the SSD a sequential O_DIRECT read of the tier's own segment files, 4 MiB "
        "reads, 32 in flight (the disk" +
        std::string(ssd_dirs.size() > 1 ? "; every directory at once" : "") + ").");
    r.add_note("prefill bound = 2 x 8e9 x tokens FLOPs at " + fmt_double(rate.tflops, 3) +
               " TFLOP/s (" + rate.source +
               "); a real prefill is slower (attention, memory, launch overheads), so "
               "restore/bound overstates restore's cost.");
    r.set_meta("matmul_tflops", fmt_double(rate.tflops, 3));
    r.set_meta("matmul_source", rate.source);
    r.print();
    r.write_json(output_path("e2e_bench_8b.json"));
  }
  return 0;
}
