// matmul_bench: the engine's projections (engine/model/matmul.h) at a 1B Llama's shapes, in
// TFLOP/s, beside PyTorch's matmul of the same shapes on the same GPU when given
// (bench/matmul_rate.py --shapes ... prints the lines --reference reads; run it in the same device
// call). Each row: x [rows, k] @ w [k, n] with f32 output, the kernel the model would use, the
// launcher's tile or (--all-tiles) every tile the tensor-load kernel has. Times are medians of
// submissions of back-to-back launches between GPU timestamps, after a warm-up
// (bench/harness/gpu_launch_timing.h).
#include <cstdint>
#include <fstream>
#include <iostream>
#include <map>
#include <stdexcept>
#include <tuple>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "base/log.h"
#include "bench/harness/bench_must.h"
#include "bench/harness/bench_report.h"
#include "bench/harness/ggml_peer.h"
#include "bench/harness/gpu_launch_timing.h"
#include "engine/model/matmul.h"

using namespace kvtier;
using namespace kvtier::bench;

namespace {

struct Shape {
  std::string name;
  uint32_t k, n;
};

// Values in [-1, 1) from a 64-bit LCG: the sizes here (up to 8192 x 8192) make <random> slow.
std::vector<float> pseudo_random(size_t count, uint64_t seed) {
  std::vector<float> v(count);
  uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (float& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<float>(static_cast<int32_t>(s >> 32)) * 0x1p-31f;
  }
  return v;
}

const char* kernel_name(MatmulKernel k) {
  switch (k) {
    case MatmulKernel::kScalar:
      return "scalar";
    case MatmulKernel::kCoopmat:
      return "coopmat";
    case MatmulKernel::kTensorLoads:
      return "matmul_cm2";
  }
  return "?";
}

using ShapeKey = std::tuple<uint32_t, uint32_t, uint32_t>;

// PyTorch's TFLOP/s per (rows, k, n), from matmul_rate.py's JSON lines.
std::map<ShapeKey, double> read_reference(const std::string& path) {
  std::map<ShapeKey, double> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.contains("rows") || !j.contains("tflops")) continue;
    out[{j["rows"].get<uint32_t>(), j["k"].get<uint32_t>(), j["n"].get<uint32_t>()}] =
        j["tflops"].get<double>();
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"matmul_bench: the engine's projections at a 1B Llama's shapes"};
  std::vector<uint32_t> rows_list = {1, 16, 2048, 8192, 32768};
  int reps = 7;
  bool all_tiles = false;
  std::string reference;
  app.add_option("--rows", rows_list, "Rows (tokens) per launch")->capture_default_str();
  app.add_option("--reps", reps)->capture_default_str();
  app.add_flag("--all-tiles", all_tiles,
               "Time every tile of the tensor-load kernel, not only the launcher's");
  app.add_option("--reference", reference,
                 "JSON lines from bench/matmul_rate.py --shapes (PyTorch, same GPU)");
  std::vector<std::string> shape_specs;
  app.add_option("--shape", shape_specs,
                 "NAME:K:N, repeated: these shapes instead of the 1B's (e.g. logits:2048:32768)");
  std::string ggml_peer_path;
  app.add_option("--ggml-peer", ggml_peer_path,
                 "Output of ../shared/device/ggml-peer/run.sh from the same device call "
                 "(ggml-vulkan's MUL_MAT beside ours)");
  CLI11_PARSE(app, argc, argv);
  init_logging("warn");
  const std::unique_ptr<VulkanContext> gpu = vulkan_or_exit();
  VulkanContext& ctx = *gpu;
  const auto die = exit_with;
  std::unique_ptr<GpuTimer> timer;
  if (auto t = GpuTimer::create(ctx); t.ok()) timer = std::move(t).value();
  const auto torch = reference.empty() ? std::map<ShapeKey, double>{} : read_reference(reference);
  std::optional<GgmlPeer> ggml;
  if (!ggml_peer_path.empty()) ggml = must(GgmlPeer::read(ggml_peer_path));

  // Llama-3.2-1B's projections (hidden 2048, 8 KV heads of 64, FFN 8192), and a square one.
  std::vector<Shape> shapes = {{"q / o", 2048, 2048},     {"k / v", 2048, 512},
                               {"gate / up", 2048, 8192}, {"down", 8192, 2048},
                               {"q k v", 2048, 3072},     {"4096^2", 4096, 4096}};
  if (!shape_specs.empty()) shapes.clear();
  for (const std::string& spec : shape_specs) {
    const size_t a = spec.find(':'), b = spec.find(':', a == std::string::npos ? a : a + 1);
    Shape s{spec.substr(0, a), 0, 0};
    try {
      if (b == std::string::npos) throw std::invalid_argument(spec);
      s.k = static_cast<uint32_t>(std::stoul(spec.substr(a + 1, b - a - 1)));
      s.n = static_cast<uint32_t>(std::stoul(spec.substr(b + 1)));
    } catch (const std::exception&) {
      std::cerr << "--shape " << spec << ": expected NAME:K:N\n";
      return 2;
    }
    shapes.push_back(s);
  }
  Report report("matmul_bench: x [rows, k] @ w [k, n], f32 out",
                {"shape", "rows", "k", "n", "kernel", "tile", "ms", "TFLOP/s", "PyTorch TFLOP/s",
                 "ours / PyTorch", "ggml-vulkan TFLOP/s", "ours / ggml"});
  report.set_meta("device", ctx.info().name + " (" + ctx.info().driver + ")");
  report.set_meta("machine", machine_description());
  report.set_meta("method", "median of " + std::to_string(reps) +
                                " submissions of back-to-back launches, " +
                                (timer ? "GPU timestamps" : "host submit-and-wait") + ", after " +
                                fmt_double(kWarmUpSeconds) + " s of the same launches untimed (" +
                                fmt_double(kFirstWarmUpSeconds, 1) + " s before the first)");
  for (const Shape& shape : shapes) {
    const auto w_values = pseudo_random(size_t{shape.k} * shape.n, shape.k * 31 + shape.n);
    auto weights_or = MatmulWeights::upload(ctx, w_values, shape.k, shape.n,
                                            ctx.info().coopmat_f16 || ctx.info().coopmat2);
    if (!weights_or.ok()) die(weights_or.status());
    const MatmulWeights& w = *weights_or;
    for (uint32_t rows : rows_list) {
      const auto x_values = pseudo_random(size_t{rows} * shape.k, rows + shape.k);
      auto x = upload_new<float>(ctx, std::span<const float>(x_values));
      auto x16 = GpuBuffer::create(ctx, size_t{rows} * shape.k * 2, MemoryKind::kDevice);
      auto y = GpuBuffer::create(ctx, size_t{rows} * shape.n * 4, MemoryKind::kDevice);
      if (!x.ok() || !x16.ok() || !y.ok())
        die(!x.ok() ? x.status() : !x16.ok() ? x16.status() : y.status());
      Matmul mm(ctx);
      MatmulInput in{x->address(), 0};
      if (w.takes_half_input()) {
        auto b = CommandBatch::begin(ctx);
        if (!b.ok()) die(b.status());
        if (Status s =
                mm.record_half_copy(*b, x->address(), x16->address(), size_t{rows} * shape.k);
            !s.ok())
          die(s);
        if (Status s = b->submit_and_wait(); !s.ok()) die(s);
        in.f16 = x16->address();
      }
      std::vector<std::optional<MatmulTile>> tiles = {std::nullopt};
      if (all_tiles && w.takes_half_input()) {
        for (const MatmulTile& t : Matmul::candidate_tiles()) tiles.push_back(t);
      }
      const double flops = 2.0 * rows * shape.k * shape.n;
      const int per_submit = flops > 1e10 ? 5 : 50;
      for (const auto& tile : tiles) {
        auto t = time_launches(ctx, timer.get(), per_submit, reps, [&](CommandBatch& b) {
          KVTIER_RETURN_IF_ERROR(mm.record(b, in, w, y->address(), rows, false, tile));
          b.barrier();
          return ok_status();
        });
        if (!t.ok()) die(t.status());
        const MatmulTile used =
            tile.value_or(Matmul::pick_tile(rows, shape.n, 0, ctx.info().sm_count));
        const std::string tile_text =
            !w.takes_half_input()
                ? "-"
                : (tile ? "" : "auto ") + std::to_string(used.rows) + "x" +
                      std::to_string(used.cols) + " k" + std::to_string(used.k_step) + " u" +
                      std::to_string(used.unroll) + " t" + std::to_string(used.threads) + " g" +
                      std::to_string(used.group_m
                                         ? used.group_m
                                         : Matmul::row_tile_group(uint64_t{shape.k} * shape.n * 2));
        const double tflops = flops / *t / 1e12;
        const auto ref = torch.find({rows, shape.k, shape.n});
        // ggml's weights as ours are: f16 (its MUL_MAT m is our n, its n our rows).
        const auto peer = ggml ? ggml->mul_mat_us(rows, shape.k, shape.n, "f16") : std::nullopt;
        const double peer_us = peer.value_or(0.0);  // read only where `peer` holds one
        report.add_row({shape.name, std::to_string(rows), std::to_string(shape.k),
                        std::to_string(shape.n), kernel_name(w.kernel()), tile_text,
                        fmt_double(*t * 1e3, 3), fmt_double(tflops, 1),
                        ref == torch.end() ? "-" : fmt_double(ref->second, 1),
                        ref == torch.end() ? "-" : fmt_double(tflops / ref->second, 2),
                        peer ? fmt_double(flops / (peer_us * 1e-6) / 1e12, 1) : "-",
                        peer ? fmt_double(peer_us * 1e-6 / *t, 2) : "-"});
      }
    }
  }
  report.add_note(
      "PyTorch: f16 x f16 -> f16 torch.matmul (cuBLAS) of the same shapes, CUDA events, same GPU "
      "and call. ggml-vulkan: test-backend-ops MUL_MAT with f16 weights, the fastest of its "
      "f32-accumulating variants (--ggml-peer; its own host-timed us/run)");
  report.print();
  report.write_json(output_path("matmul_bench.json"));
  return 0;
}
