// hit_ratio_bench: token hit ratio of every eviction policy and SSD admission rule on the four
// traces (bench/traces), against Belady's MIN for the same capacity and against LRU, today's
// policy. Each trace is written as JSON lines (so it can be replayed elsewhere), replayed through
// the real RAM and SSD tiers, and reported: hits per tier, SSD bytes written, and blocks written
// to the SSD but never read back.
#include <CLI/CLI.hpp>

#include <filesystem>
#include <iostream>

#include "base/byte_size.h"
#include "base/log.h"
#include "base/memory/memory_policy.h"
#include "bench/harness/bench_report.h"
#include "bench/traces/belady.h"
#include "bench/traces/replay.h"
#include "bench/traces/trace_generator.h"
#include "tests/support/temp_dir.h"

using namespace kvtier;
using namespace kvtier::bench;

int main(int argc, char** argv) {
  CLI::App app{"hit_ratio_bench: eviction policies and SSD admission vs Belady on traces"};
  double scale = 1.0, ram_fraction = 0.10, ssd_fraction = 0.50;
  std::vector<std::string> kinds{"chat", "rag", "agent", "scan"};
  std::vector<std::string> configs{"lru/all", "chain-lru/all", "s3fifo/all", "s3fifo-chain/all",
                                   "chain-lru/seen-twice", "s3fifo-chain/seen-twice"};
  app.add_option("--scale", scale, "Trace size (1.0: the benchmark's)")->capture_default_str();
  app.add_option("--ram-fraction", ram_fraction, "RAM capacity / working set")->capture_default_str();
  app.add_option("--ssd-fraction", ssd_fraction, "SSD capacity / working set")->capture_default_str();
  app.add_option("--traces", kinds, "Trace kinds")->capture_default_str();
  app.add_option("--configs", configs, "eviction/admission pairs")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  keep_freed_block_memory();
  init_logging("error");

  const std::string out_dir = output_path("traces");
  std::filesystem::create_directories(out_dir);
  const auto layout = std::make_shared<const KvLayout>(KvLayout::uniform("replay", 1, 1, 8, 16, DType::kBF16));
  const PrefixHasher hasher(HashAlgorithm::kXxh3, Namespace{"replay", layout->fingerprint(), ""}, 16);

  Report report("hit_ratio_bench: token hit ratio by policy (RAM " + fmt_double(ram_fraction * 100, 0) + "% and SSD " +
                    fmt_double(ssd_fraction * 100, 0) + "% of each trace's working set)",
                {"trace", "eviction/admission", "RAM %", "SSD %", "total %", "Belady %", "vs Belady",
                 "vs LRU (points)", "SSD written", "written, never read %"});
  report.set_meta("machine", machine_description());
  report.set_meta("method", "one replay per trace and policy through the real RamTier and SsdTier; Belady's MIN "
                            "(chain-aware, block-granular) for RAM + SSD capacity");
  for (const std::string& kind : kinds) {
    auto trace = generate_trace(kind, {scale, 1});
    if (!trace.ok()) {
      std::cerr << trace.status().to_string() << "\n";
      return 2;
    }
    (void)write_trace_jsonl(*trace, out_dir + "/" + kind + ".jsonl");
    const BlockTrace blocks = to_block_trace(*trace, hasher);
    const size_t working_set = blocks.depth.size();
    const size_t ram = std::max<size_t>(4, static_cast<size_t>(working_set * ram_fraction));
    const size_t ssd = static_cast<size_t>(working_set * ssd_fraction);
    const BeladyResult ceiling = belady(blocks, ram + ssd);
    const double belady_ratio = static_cast<double>(ceiling.hit_tokens) / blocks.prompt_tokens;
    std::cerr << kind << ": " << trace->requests.size() << " requests, " << blocks.prompt_tokens << " tokens, "
              << working_set << " distinct blocks; Belady " << fmt_double(belady_ratio * 100, 1) << "%\n";
    double lru = -1;
    for (const std::string& config : configs) {
      const size_t slash = config.find('/');
      testing::TempDir scratch;
      ReplayOptions o{config.substr(0, slash), config.substr(slash + 1), ram, ssd, scratch.str()};
      auto r = replay(*trace, o);
      if (!r.ok()) {
        std::cerr << config << ": " << r.status().to_string() << "\n";
        return 1;
      }
      const double total = r->hit_ratio();
      if (config == "lru/all") lru = total;
      const double never_read = r->ssd_blocks_written
                                    ? 100.0 * (r->ssd_blocks_written - r->ssd_blocks_read_back) / r->ssd_blocks_written
                                    : 0;
      report.add_row({kind, config, fmt_double(100.0 * r->hit_tokens_ram / r->prompt_tokens, 1),
                      fmt_double(100.0 * r->hit_tokens_ssd / r->prompt_tokens, 1), fmt_double(total * 100, 1),
                      fmt_double(belady_ratio * 100, 1), fmt_double(belady_ratio > 0 ? total / belady_ratio : 0),
                      lru < 0 ? "" : fmt_double((total - lru) * 100, 1), format_byte_size(r->ssd_bytes_written),
                      fmt_double(never_read, 0)});
      std::cerr << "  " << config << " " << fmt_double(total * 100, 1) << "% in " << fmt_double(r->seconds, 1) << " s\n";
    }
  }
  report.add_note("SSD written: record bytes (4 KiB per block of this replay layout); a block read back once or "
                  "more is not 'never read'");
  report.add_note("traces as JSON lines in " + out_dir);
  report.print();
  report.write_json(output_path("hit_ratio_bench.json"));
  return 0;
}
