// engine_bench: the attention kernels on the GPU.
//  * copy kernel bandwidth (bytes read + written per second): the reference, same run
//  * paged decode attention, batch 1/8/64 x context 1k/8k/32k, 32 query heads / 8 KV heads,
//    head_dim 128, block 16, bf16 and f16: time per call and achieved K/V bandwidth as a fraction
//    of the copy kernel's
//  * varlen prefill of 4k- and 16k-token prompts on each attention path the device has (scalar,
//    cooperative matrices): tokens per second and TFLOP/s (bench/engine_sdpa_reference.py prints
//    PyTorch SDPA's on the same shapes)
// Times are medians over repetitions of a submission holding back-to-back launches, timed by the
// GPU's timestamps around them (as CUDA events time the PyTorch reference); --host-timed times the
// host's submit-and-wait instead, which adds the submission's round trip divided by the launches.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <numeric>
#include <optional>
#include <random>
#include <utility>

#include <CLI/CLI.hpp>

#include "base/byte_size.h"
#include "base/log.h"
#include "bench/harness/bench_must.h"
#include "bench/harness/bench_report.h"
#include "bench/harness/ggml_peer.h"
#include "bench/harness/gpu_launch_timing.h"
#include "engine/attention/paged_attention.h"
#include "engine/vulkan/gpu_timer.h"

using namespace kvtier;
using namespace kvtier::bench;
using Clock = std::chrono::steady_clock;

namespace {

struct CopyParams {
  uint64_t src, dst, words;
};

// Bytes read plus written per second by a plain copy kernel between two buffers of `bytes`,
// `per_submit` launches back to back (each with its barrier, as the attention launches have).
Result<double> copy_rate(VulkanContext& ctx, GpuTimer* timer, uint64_t bytes, int per_submit, int reps) {
  KVTIER_ASSIGN_OR_RETURN(GpuBuffer src, GpuBuffer::create(ctx, bytes, MemoryKind::kDevice));
  KVTIER_ASSIGN_OR_RETURN(GpuBuffer dst, GpuBuffer::create(ctx, bytes, MemoryKind::kDevice));
  KVTIER_ASSIGN_OR_RETURN(auto pipeline, ctx.pipeline("copy_bandwidth", {}, sizeof(CopyParams)));
  CopyParams p{src.address(), dst.address(), bytes / 16};
  const uint32_t groups = static_cast<uint32_t>(std::clamp<uint64_t>(bytes / 16 / 256, 1, 65535));
  KVTIER_ASSIGN_OR_RETURN(double t, time_launches(ctx, timer, per_submit, reps, [&](CommandBatch& b) {
                            b.dispatch(*pipeline, p, groups);
                            b.barrier();
                            return ok_status();
                          }));
  return 2.0 * bytes / t;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"engine_bench: paged attention on the GPU vs a copy kernel"};
  std::vector<int> batches = {1, 8, 64}, contexts = {1024, 8192, 32768};
  std::vector<std::string> dtypes = {"BF16", "F16"};
  uint64_t max_kv_bytes = 20ull << 30;
  uint64_t copy_bytes = 1ull << 30;
  int reps = 7;
  std::vector<int> prefill_tokens = {4096, 16384};
  app.add_option("--batches", batches);
  app.add_option("--contexts", contexts);
  app.add_option("--dtypes", dtypes);
  app.add_option("--max-kv-bytes", max_kv_bytes, "Skip decode shapes whose K+V exceed this");
  app.add_option("--copy-bytes", copy_bytes, "Size of the copy kernel's buffers");
  app.add_option("--reps", reps);
  int rounds = 3;
  app.add_option("--rounds", rounds, "Decode: each shape's dtypes measured in turns this many times (medians)")
      ->capture_default_str();
  app.add_option("--prefill-tokens", prefill_tokens);
  std::vector<std::string> prefill_paths = {"scalar", "coopmat", "coopmat2"};
  app.add_option("--prefill-paths", prefill_paths, "Prefill paths to time, those the device has (scalar, coopmat, coopmat2; none: no prefill)")
      ->capture_default_str();
  std::vector<uint32_t> prefill_shape = {32, 8, 128};
  app.add_option("--prefill-shape", prefill_shape,
                 "Prefill: query heads, KV heads, head_dim (1B Llama: 32 8 64)")
      ->expected(3)
      ->capture_default_str();
  std::vector<std::string> prefill_splits = {"auto"};
  app.add_option(
         "--prefill-splits", prefill_splits,
         "Prefill launches: auto (the launcher's choice), split (a workgroup per 512-key split)")
      ->capture_default_str();
  bool skip_decode = false;
  app.add_flag("--skip-decode", skip_decode, "Prefill only");
  std::string ggml_peer_path;
  app.add_option("--ggml-peer", ggml_peer_path,
                 "Output of ../shared/device/ggml-peer/run.sh from the same device call "
                 "(ggml-vulkan's FLASH_ATTN_EXT beside ours, where it ran the same shape)");
  bool host_timed = false;
  app.add_flag("--host-timed", host_timed, "Time the host's submit-and-wait, not the GPU's timestamps");
  CLI11_PARSE(app, argc, argv);
  for (const std::string& name : prefill_paths) {  // a misspelt path would silently time nothing
    if (name != "scalar" && name != "coopmat" && name != "coopmat2" && name != "none") {
      std::cerr << "--prefill-paths: unknown path '" << name << "' (scalar, coopmat, coopmat2, none)\n";
      return 2;
    }
  }
  for (const std::string& name : dtypes) {  // names as safetensors spells them: BF16, F16, F32
    const auto dtype = parse_dtype(name);
    if (!dtype.ok() || !is_kv_dtype(*dtype)) {
      std::cerr << "--dtypes: '" << name << "' is not a KV dtype (BF16, F16, F32)\n";
      return 2;
    }
  }
  init_logging("warn");
  std::optional<GgmlPeer> ggml;
  if (!ggml_peer_path.empty()) ggml = must(GgmlPeer::read(ggml_peer_path));
  // ggml's time over ours for a shape it ran: above 1, ours is faster.
  auto peer_columns = [&](std::optional<double> peer_us, double ours_s, double unit) {
    if (!peer_us) return std::pair<std::string, std::string>{"-", "-"};
    return std::pair{fmt_double(*peer_us * 1e-6 * unit, 2),
                     fmt_double(*peer_us * 1e-6 / ours_s, 2)};
  };
  const std::unique_ptr<VulkanContext> gpu = vulkan_or_exit();
  VulkanContext& ctx = *gpu;
  const auto die = exit_with;

  std::unique_ptr<GpuTimer> timer;
  if (!host_timed) {
    auto t = GpuTimer::create(ctx);
    if (t.ok()) {
      timer = std::move(t).value();
    } else {
      std::cerr << "timing on the host: " << t.status().to_string() << "\n";
    }
  }
  const std::string timing = timer ? "GPU timestamps around the launches" : "host-timed submit-and-wait";

  // Reference: a plain copy kernel.
  auto copy_or = copy_rate(ctx, timer.get(), copy_bytes, 10, reps);
  if (!copy_or.ok()) die(copy_or.status());
  const double copy_bps = *copy_or;

  Report report(
      "engine_bench: paged decode attention, 32 query heads / 8 KV heads, head_dim 128, "
      "block 16",
      {"dtype", "batch", "context", "K+V bytes", "us / call", "GB/s", "vs copy kernel",
       "vs copy of the same bytes", "ggml-vulkan us (F16)", "ggml / ours"});
  report.set_meta("device", ctx.info().name + " (" + ctx.info().driver + ")");
  report.set_meta("machine", machine_description());
  report.set_meta("copy kernel", fmt_double(copy_bps / 1e9, 1) + " GB/s (bytes read + written, " +
                                     format_byte_size(copy_bytes) + " buffers)");
  report.set_meta("method", "median over " + std::to_string(rounds) + " rounds (a shape's dtypes in turns, the order flipped each round) of the median of " + std::to_string(reps) + " submissions of back-to-back launches, " + timing);
  const uint32_t heads = 32, kv_heads = 8, dim = 128, block = 16;
  std::mt19937_64 rng(1);
  struct Timed {
    double seconds = 0, same_bps = 0;  // same_bps 0: the copy of the same bytes failed
  };
  // One shape in one dtype: its own buffers, a scattered page table, timed launches, then the
  // copy kernel over the same bytes right after.
  auto measure = [&](DType dt, const std::string& dname, int batch, int context, bool first_round) -> Timed {
    const uint64_t blocks_per_seq = (context + block - 1) / block;
    const uint64_t blocks = blocks_per_seq * batch;
    const uint64_t array_bytes = blocks * block * kv_heads * dim * dtype_size(dt);
    auto k = GpuBuffer::create(ctx, array_bytes, MemoryKind::kDevice);
    auto v = GpuBuffer::create(ctx, array_bytes, MemoryKind::kDevice);
    if (!k.ok() || !v.ok()) die(k.ok() ? v.status() : k.status());
    // A realistic page table: every sequence's blocks scattered over the arrays.
    std::vector<int32_t> perm(blocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int32_t> lens(batch, context);
    std::vector<float> q(static_cast<size_t>(batch) * heads * dim, 0.01f);
    auto gt = upload_new<int32_t>(ctx, perm);
    auto gl = upload_new<int32_t>(ctx, lens);
    auto gq = upload_new<float>(ctx, q);
    auto go = GpuBuffer::create(ctx, q.size() * 4, MemoryKind::kDevice);
    if (!gt.ok() || !gl.ok() || !gq.ok() || !go.ok()) die(internal_error("upload failed"));
    PagedKvView view{k->address(), v->address(), static_cast<uint32_t>(blocks), block, kv_heads, dim, dt};
    DecodeBatch db{gq->address(), go->address(), gt->address(), static_cast<uint32_t>(blocks_per_seq),
                   gl->address(), static_cast<uint32_t>(batch), static_cast<uint32_t>(context), heads};
    AttentionOptions o{1.0f / std::sqrt(128.0f), 0, 0};
    PagedAttentionDecode decode(ctx);
    if (ctx.info().pipeline_stats && first_round && batch == batches.front() && context == contexts.front()) {
      std::cout << "decode pipeline (" << dname << "): " << decode.pipeline_statistics(view, heads / kv_heads) << "\n";
    }
    const int per_submit = static_cast<int>(std::clamp<uint64_t>((256ull << 20) / (2 * array_bytes), 3, 200));
    auto t = time_launches(ctx, timer.get(), per_submit, reps, [&](CommandBatch& b) { return decode.record(b, db, view, o); });
    if (!t.ok()) die(t.status());
    // The same bytes through the copy kernel, launched as often: what one launch of this size
    // can reach on this GPU (a small launch cannot fill it, whatever it does).
    auto same = copy_rate(ctx, timer.get(), array_bytes, per_submit, reps);
    return {*t, same.ok() ? *same : 0.0};
  };
  // Shapes outermost, and each shape's dtypes in turns (the order flipping every round), medians
  // over the rounds: the GPU's speed drifts over a run. On a freshly started H100 host, whichever
  // dtype ran second in engine_bench's first process read at half speed (the copy of the same
  // bytes slowed too), and a second process measured both alike — so F16 "ran 2x slower than
  // BF16" only because it came second (swapping the order swapped the result).
  for (int batch : skip_decode ? std::vector<int>{} : batches) {
    for (int context : contexts) {
      std::vector<std::vector<Timed>> got(dtypes.size());
      for (int round = 0; round < rounds; ++round) {
        for (size_t n = 0; n < dtypes.size(); ++n) {
          const size_t i = round % 2 == 0 ? n : dtypes.size() - 1 - n;
          const DType dt = *parse_dtype(dtypes[i]);
          const uint64_t array_bytes = uint64_t(context + block - 1) / block * batch * block * kv_heads * dim * dtype_size(dt);
          if (2 * array_bytes > max_kv_bytes) continue;
          got[i].push_back(measure(dt, dtypes[i], batch, context, round == 0));
        }
      }
      for (size_t i = 0; i < dtypes.size(); ++i) {
        const DType dt = *parse_dtype(dtypes[i]);
        const uint64_t array_bytes = uint64_t(context + block - 1) / block * batch * block * kv_heads * dim * dtype_size(dt);
        if (got[i].empty()) {
          report.add_row({dtypes[i], std::to_string(batch), std::to_string(context),
                          format_byte_size(2 * array_bytes), "skipped (--max-kv-bytes)", "", "", "",
                          "", ""});
          continue;
        }
        std::vector<double> secs, vs_same;
        for (const Timed& t : got[i]) {
          secs.push_back(t.seconds);
          if (t.same_bps > 0) vs_same.push_back(2.0 * array_bytes / t.seconds / t.same_bps);
        }
        const double t = median(secs), bps = 2.0 * array_bytes / t;
        const auto [peer_us, peer_ratio] = peer_columns(
            ggml ? ggml->attention_us(dim, kv_heads, heads / kv_heads, 1, context, batch, false)
                 : std::nullopt,
            t, 1e6);
        report.add_row({dtypes[i], std::to_string(batch), std::to_string(context),
                        format_byte_size(2 * array_bytes), fmt_double(t * 1e6, 1),
                        fmt_double(bps / 1e9, 1), fmt_double(bps / copy_bps, 2),
                        vs_same.empty() ? "n/a" : fmt_double(median(vs_same), 2), peer_us,
                        peer_ratio});
      }
    }
  }
  report.add_note(
      "GB/s counts the K and V bytes each call must read; the copy kernel counts "
      "bytes read plus written. 'vs copy of the same bytes': against the copy kernel "
      "between two buffers of K's size (as many bytes moved per launch as the call reads), "
      "timed the same way right after it. Issue 15's goals are against the 1 GiB copy. "
      "ggml-vulkan (--ggml-peer): test-backend-ops FLASH_ATTN_EXT of the same shape, F16 "
      "K/V, no mask, the fastest of its precisions; its own host-timed us/run.");
  // A skipped table writes no JSON: an empty one would replace the figures of an earlier run.
  if (!skip_decode) {
    report.print();
    report.write_json(output_path("engine_bench_decode.json"));
  }

  // Varlen prefill of one prompt, on each path.
  using Path = PagedAttentionVarlen::Path;
  auto wanted = [&](const char* name) {
    return std::find(prefill_paths.begin(), prefill_paths.end(), name) != prefill_paths.end();
  };
  std::vector<Path> paths;
  if (wanted("scalar")) paths.push_back(Path::kScalar);
  if (ctx.info().coopmat_f16 && wanted("coopmat")) paths.push_back(Path::kCoopMat);
  if (ctx.info().coopmat2 && wanted("coopmat2")) paths.push_back(Path::kCoopMat2);
  const uint32_t p_heads = prefill_shape[0], p_kv_heads = prefill_shape[1],
                 p_dim = prefill_shape[2];
  std::vector<std::pair<std::string, PagedAttentionVarlen::SplitPolicy>> split_policies;
  for (const std::string& name : prefill_splits) {
    split_policies.emplace_back(name, name == "split"
                                          ? PagedAttentionVarlen::SplitPolicy::kWorkgroupPerSplit
                                          : PagedAttentionVarlen::SplitPolicy::kAuto);
  }
  Report prefill("engine_bench: varlen prefill, one prompt, " + std::to_string(p_heads) + " / " +
                     std::to_string(p_kv_heads) + " heads, head_dim " + std::to_string(p_dim) +
                     ", causal",
                 {"tokens", "dtype", "path", "launch", "ms / call", "tokens/s", "attention TFLOP/s",
                  "ggml-vulkan ms (F16)", "ggml / ours"});
  prefill.set_meta("device", ctx.info().name);
  prefill.set_meta("tensor-core kernels", ctx.info().coopmat_khr ? "GL_KHR_cooperative_matrix spelling"
                                          : ctx.info().coopmat_mma_fragments ? "GL_NV_cooperative_matrix spelling"
                                                                            : "none");
  prefill.set_meta("method", "median of " + std::to_string(reps) + " launches, " + timing);
  if (ggml) {
    prefill.add_note(
        "ggml-vulkan: test-backend-ops FLASH_ATTN_EXT of the same shape (the peer kit's "
        "causal mask), F16 K/V, the fastest of its precisions; its own host-timed us/run.");
  }
  for (int tokens : prefill_tokens) {
    for (const std::string& dname : dtypes) {
      const DType dt = *parse_dtype(dname);
      const uint64_t blocks = (tokens + block - 1) / block;
      const uint64_t array_bytes = blocks * block * p_kv_heads * p_dim * dtype_size(dt);
      auto k = GpuBuffer::create(ctx, array_bytes, MemoryKind::kDevice);
      auto v = GpuBuffer::create(ctx, array_bytes, MemoryKind::kDevice);
      std::vector<int32_t> table(blocks);
      std::iota(table.begin(), table.end(), 0);
      std::vector<int32_t> lens = {tokens}, cu = {0, tokens};
      std::vector<float> q(static_cast<size_t>(tokens) * p_heads * p_dim, 0.01f);
      auto gt = upload_new<int32_t>(ctx, table);
      auto gl = upload_new<int32_t>(ctx, lens);
      auto gcu = upload_new<int32_t>(ctx, cu);
      auto gq = upload_new<float>(ctx, q);
      auto go = GpuBuffer::create(ctx, q.size() * 4, MemoryKind::kDevice);
      if (!k.ok() || !v.ok() || !gt.ok() || !gl.ok() || !gcu.ok() || !gq.ok() || !go.ok()) {
        die(internal_error("prefill set-up failed"));
      }
      {  // device memory starts undefined: zeros keep every path finite
        auto fill = CommandBatch::begin(ctx);
        if (!fill.ok()) die(fill.status());
        fill->fill(*k, 0, array_bytes, 0);
        fill->fill(*v, 0, array_bytes, 0);
        if (Status st = fill->submit_and_wait(); !st.ok()) die(st);
      }
      PagedKvView view{
          k->address(), v->address(), static_cast<uint32_t>(blocks), block, p_kv_heads, p_dim, dt};
      VarlenBatch vb{gq->address(),
                     go->address(),
                     gt->address(),
                     static_cast<uint32_t>(blocks),
                     gl->address(),
                     gcu->address(),
                     cu,
                     p_heads,
                     static_cast<uint32_t>(tokens)};
      AttentionOptions o{1.0f / std::sqrt(static_cast<float>(p_dim)), 0, 0};
      for (Path path : paths) {
        // On tensor cores: the context staged as f16 first (the default), and read from the cache
        // by the kernel itself, side by side.
        const bool stages = PagedAttentionVarlen(ctx, PagedAttentionVarlen::SplitPolicy::kAuto, path).stages(view, vb);
        for (const auto& [split_name, policy] : split_policies) {
          for (const bool staging : {true, false}) {
            if (!staging && !stages) continue;
            PagedAttentionVarlen varlen(ctx, policy, path);
            varlen.set_half_staging(staging);
            // One launch per submission: the launcher rewrites its tile table per launch.
            auto t = time_launches(ctx, timer.get(), 1, reps,
                                   [&](CommandBatch& b) { return varlen.record(b, vb, view, o); });
            if (!t.ok()) die(t.status());
            // Causal attention: ~ 2 * 2 * heads * head_dim * n^2 / 2 flops.
            const double flops = 2.0 * p_heads * p_dim * static_cast<double>(tokens) * tokens;
            if (ctx.info().pipeline_stats && tokens == prefill_tokens.front() && staging) {
              std::cout << "varlen pipeline (" << dname << ", "
                        << PagedAttentionVarlen::path_name(path)
                        << "): " << varlen.pipeline_statistics(view, p_heads) << "\n";
            }
            std::string name = PagedAttentionVarlen::path_name(varlen.path(view, p_heads));
            if (staging && stages) name += ", staged as f16";
            if (!staging) name += ", reading the cache directly";
            const auto [peer_ms, peer_ratio] =
                peer_columns(ggml ? ggml->attention_us(p_dim, p_kv_heads, p_heads / p_kv_heads,
                                                       tokens, tokens, 1, true)
                                  : std::nullopt,
                             *t, 1e3);
            prefill.add_row({std::to_string(tokens), dname, name, split_name,
                             fmt_double(*t * 1e3, 2), fmt_double(tokens / *t, 0),
                             fmt_double(flops / *t / 1e12, 2), peer_ms, peer_ratio});
          }
        }
      }
    }
  }
  if (!paths.empty()) {
    prefill.print();
    prefill.write_json(output_path("engine_bench_prefill.json"));
  }
  return 0;
}
