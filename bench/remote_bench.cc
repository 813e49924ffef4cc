// remote_bench: restoring a prefix from the remote tier. Host A's cache stack (RAM + remote) writes
// a prefix of Llama-3-8B blocks to a Redis Cluster on this machine; host B's (a fresh one per
// repetition, so every block comes off Redis) fetches it: lookup (one EXISTS batch), then the
// pipelined GETs, every frame verified, promoted into B's RAM. References in the same run, on the
// same keys and values: raw GETs grouped by node at several pipeline depths, as redis-benchmark -P
// issues them (the best of them is the ceiling: bytes off Redis, nothing checked), the same with
// every value kept until the pass ends (what a restore must do with them), and the naive design
// peers ship — one GET per block, one round trip each, one node at a time. Every raw pass uses the
// same RESP client as the tier, so the ratios are kvtier's own cost.
#include <CLI/CLI.hpp>

#include <filesystem>
#include <iostream>
#include <map>
#include <numeric>
#include <thread>

#include "base/byte_size.h"
#include "base/log.h"
#include "base/memory/memory_policy.h"
#include "bench/harness/bench_report.h"
#include "cache/cache_stack.h"
#include "tests/support/redis_servers.h"
#include "tests/support/temp_dir.h"
#include "tests/support/test_blocks.h"

using namespace kvtier;
using namespace kvtier::bench;

namespace {

double seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::unique_ptr<CacheStack> open_stack(std::shared_ptr<const KvLayout> layout, const std::string& url,
                                       uint64_t ram, size_t in_flight = RemoteTierOptions{}.values_in_flight_per_node) {
  CacheStackOptions o;
  o.layout = layout;
  o.ram.capacity_bytes = ram;
  RemoteTierOptions r;
  r.address = *RedisAddress::parse(url);
  r.values_in_flight_per_node = in_flight;
  o.remote = r;
  auto s = CacheStack::open(std::move(o));
  if (!s.ok()) {
    std::cerr << "cannot open a cache stack: " << s.status().to_string() << "\n";
    std::exit(1);
  }
  return std::move(s).value();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"remote_bench: prefix restore from the remote tier (Redis Cluster) vs raw GETs"};
  size_t n_blocks = 64;
  int reps = 5, masters = 3;
  app.add_option("--blocks", n_blocks, "Blocks in the prefix (2 MiB each)")->capture_default_str();
  app.add_option("--reps", reps, "Repetitions (medians are reported)")->capture_default_str();
  app.add_option("--masters", masters, "Redis Cluster masters (each with one replica)")->capture_default_str();
  size_t in_flight = RemoteTierOptions{}.values_in_flight_per_node;
  app.add_option("--in-flight", in_flight, "The tier's values in flight per node (RemoteTierOptions)")->capture_default_str();
  bool restore_only = false;
  app.add_flag("--restore-only", restore_only, "Only kvtier's restores, no references (to profile them)");
  CLI11_PARSE(app, argc, argv);
  keep_freed_block_memory();  // as kvtierd does
  init_logging("warn");

  testing::TempDir dir;
  std::string error;
  auto redis = testing::RedisServers::cluster(dir.str(), masters, 1, &error);
  if (!redis) {
    std::cerr << "no Redis Cluster: " << error << "\n";
    return 1;
  }
  const std::string url = redis->url();
  auto layout = testing::share(*layout_preset("llama-3-8b"));
  PrefixHasher hasher(HashAlgorithm::kSha256, Namespace{"bench", layout->fingerprint(), ""}, layout->block_size);
  std::vector<uint32_t> tokens(n_blocks * 16);
  std::iota(tokens.begin(), tokens.end(), 7);
  const std::vector<BlockKey> keys = hasher.keys(tokens, {});
  const uint64_t block_bytes = layout->dense_block_bytes(), total = n_blocks * block_bytes;

  // Redis memory per stored block: used_memory of every node before and after host A's writes
  // (masters and replicas alike hold a copy).
  auto used_memory = [&] {
    uint64_t sum = 0;
    for (int port : redis->ports()) {
      const std::string info = redis->cli(port, {"INFO", "memory"});
      const size_t at = info.find("used_memory:");
      if (at != std::string::npos) sum += std::stoull(info.substr(at + 12));
    }
    return sum;
  };
  const uint64_t memory_before = used_memory();
  {  // host A writes the prefix
    auto a = open_stack(layout, url, 2 * total + (64 << 20));
    for (size_t i = 0; i < n_blocks; ++i) {
      Block b = testing::make_block(layout, i, testing::Values::kKvLike);
      b.mutable_identity() = hasher.identity(keys, i, {});
      if (!a->cache().insert(std::make_shared<const Block>(std::move(b))).ok()) return 1;
    }
    a->remote()->flush();
    if (a->remote()->metrics().written_blocks.value() != n_blocks) {
      std::cerr << "host A wrote " << a->remote()->metrics().written_blocks.value() << " blocks\n";
      return 1;
    }
  }

  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // replicas catch up
  const double memory_per_block = static_cast<double>(used_memory() - memory_before) / n_blocks / (1 + 1);
  std::vector<std::string> redis_keys;
  for (const BlockKey& k : keys) redis_keys.push_back("kvtier:" + k.hash.hex());
  RedisClusterOptions co;
  co.address = *RedisAddress::parse(url);
  auto raw = RedisCluster::open(co);
  if (!raw.ok()) return 1;
  std::map<std::string, std::vector<double>> t;
  // Per round, for ratios of pairs: the round's best raw pass, its one-in-flight pass (the restore's
  // own shape: one value in flight per node), and kvtier's restore.
  std::vector<double> best_raw, same_shape_raw, kept_raw, restore;
  uint64_t raw_bytes = 0;
  for (int r = 0; r < reps; ++r) {
    double round_best = 0;
    // The raw references: GETs grouped by node, every node at once, `depth` in flight per node
    // (redis-benchmark -P depth), nothing checked.
    for (size_t depth : {size_t{1}, size_t{2}, size_t{4}, size_t{16}}) {
      if (restore_only) break;
      std::vector<RedisCommand> cmds;
      for (const std::string& k : redis_keys) cmds.push_back({"GET", k});
      raw_bytes = 0;
      const auto t0 = std::chrono::steady_clock::now();
      (*raw)->execute(cmds, depth, [&](size_t, Result<RedisReply> rep) { raw_bytes += rep.ok() ? rep->str().size() : 0; });
      const double took = seconds(t0);
      t["raw GETs, " + std::to_string(depth) + " in flight per node"].push_back(took);
      round_best = round_best == 0 ? took : std::min(round_best, took);
      if (depth == 1) same_shape_raw.push_back(took);
    }
    // The same GETs with every value kept until the pass ends, as a restore must keep them: the
    // passes above reuse two buffers that stay in the CPU's cache, a restore lands 128 MiB in
    // memory (on the H100 host that alone made the restore's first numbers look 0.6 of raw).
    for (size_t depth : {size_t{1}, size_t{2}}) {
      if (restore_only) break;
      std::vector<RedisCommand> cmds;
      for (const std::string& k : redis_keys) cmds.push_back({"GET", k});
      std::vector<RedisReply> kept(cmds.size());
      const auto t0 = std::chrono::steady_clock::now();
      (*raw)->execute(cmds, depth, [&](size_t i, Result<RedisReply> rep) {
        if (rep.ok()) kept[i] = std::move(rep).value();
      });
      const double took = seconds(t0);
      t["raw GETs, values kept, " + std::to_string(depth) + " in flight per node"].push_back(took);
      if (depth == 1) kept_raw.push_back(took);
    }
    best_raw.push_back(round_best);
    if (!restore_only) {  // the naive design: one GET (one round trip) per block
      const auto t0 = std::chrono::steady_clock::now();
      for (const std::string& k : redis_keys) (void)(*raw)->execute(std::vector<RedisCommand>{{"GET", k}});
      t["one GET per block"].push_back(seconds(t0));
    }
    {  // kvtier: host B, cold, restores the prefix
      auto b = open_stack(layout, url, 2 * total + (64 << 20), in_flight);
      const auto t0 = std::chrono::steady_clock::now();
      const LookupResult found = b->cache().lookup(keys);
      PinnedBlocks got = b->cache().fetch(keys);
      t["kvtier lookup + fetch (verified, into RAM)"].push_back(seconds(t0));
      restore.push_back(t["kvtier lookup + fetch (verified, into RAM)"].back());
      const RemoteTierMetrics& m = b->remote()->metrics();
      t["  of which the lookup's EXISTS batch"].push_back(m.exists_seconds.snapshot().sum);
      t["  of which the GETs, verified"].push_back(m.read_seconds.snapshot().sum);
      if (found.blocks.size() != n_blocks || got.size() != n_blocks) {
        std::cerr << "host B restored " << got.size() << " of " << n_blocks << " blocks\n";
        return 1;
      }
    }
  }
  double ceiling = 0;
  std::string best;
  for (const auto& [name, samples] : t) {
    if (name.rfind("raw", 0) == 0 && total / median(samples) > ceiling) {
      ceiling = total / median(samples);
      best = name;
    }
  }
  Report report("remote_bench: restore a " + std::to_string(n_blocks) + "-block Llama-3-8B prefix (" +
                    format_byte_size(total) + ") from a " + std::to_string(masters) + "-master Redis Cluster on loopback",
                {"path", "GB/s", "vs the best raw GETs", "ms"});
  report.set_meta("machine", machine_description());
  report.set_meta("method", "median of " + std::to_string(reps) + " repetitions; GB/s of block data");
  for (const auto& [name, samples] : t) {
    const double s = median(samples);
    report.add_row({name, fmt_double(total / s / 1e9), ceiling > 0 ? fmt_double(total / s / ceiling) : "-",
                    fmt_double(s * 1e3, 1)});
  }
  report.add_note("the best raw reference: " + best);
  // Rounds alternate the references and kvtier, so a drifting host moves both sides of a pair.
  const PairedRatio vs_best = paired_ratio(best_raw, restore), vs_same = paired_ratio(same_shape_raw, restore),
                    vs_kept = paired_ratio(kept_raw, restore);
  report.add_note("kvtier per round, median [min-max] of " + std::to_string(vs_best.pairs) + " pairs: " +
                  vs_best.text() + " of that round's best raw GETs, " + vs_same.text() +
                  " of its raw GETs with one value in flight per node (the restore's pipelining), " + vs_kept.text() +
                  " of those GETs keeping every value (the restore's pipelining and memory)");
  report.set_meta("paired_vs_best_raw", vs_best.text());
  report.set_meta("paired_vs_same_shape_raw", vs_same.text());
  report.set_meta("paired_vs_kept_raw", vs_kept.text());
  report.add_note("Redis memory per block, per copy (used_memory over masters and replicas / 2): " +
                  format_byte_size(static_cast<uint64_t>(memory_per_block)) + " for " +
                  format_byte_size(block_bytes) + " of KV");
  report.set_meta("redis_bytes_per_block", fmt_double(memory_per_block, 0));
  report.add_note("value bytes per raw GET pass: " + format_byte_size(raw_bytes) + " (frames: header + document)");
  report.add_note("goal (issue 37): kvtier >= 0.9 of raw pipelined GETs");
  report.print();
  report.write_json(output_path("remote_bench.json"));
  return 0;
}
