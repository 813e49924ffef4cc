// kv_events_bench: what publishing KV events costs kvtierd's data path. kvtierd's doors (the binary
// port by default, or HTTP) in this process over a RAM tier small enough that every PUT evicts, so
// each PUT is a BlockStored and a BlockRemoved; clients PUT new blocks and GET recent ones for
// --seconds. Each round runs once without --kv-events and once with it and a subscriber that
// connects, subscribes and never reads (so batches end up held back), in alternating order.
// Printed: PUT and GET rates and p50/p99 latencies of both, their ratio round by round, events/s,
// batches held back and events dropped, the replay ring's bytes, the process's RSS and the CPU
// time of the publisher's thread. With --server-cores K the server's side (doors, tiers,
// publisher, the extra events' pump) runs on the first K cores and the clients on the rest, so
// the clients' load does not decide what the server's cores are free to do.
#include <dirent.h>
#include <pthread.h>
#include <sched.h>
#include <zmq.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include <CLI/CLI.hpp>

#include "bench/harness/bench_must.h"
#include "bench/harness/bench_report.h"
#include "serialize/format/block_codec.h"
#include "server/block_service.h"
#include "server/cli/kvtier_client.h"
#include "server/http/http_api.h"
#include "server/synthetic_block.h"
#include "server/wire/wire_server.h"

using namespace kvtier;
using namespace kvtier::bench;
using Clock = std::chrono::steady_clock;

namespace {

struct Doc {
  BlockHash hash;
  Bytes bytes;
};

constexpr const char* kNamespace = "bench";

// One-block prompts, hashed as the server hashes them, encoded once before the clock starts.
std::vector<Doc> documents(const std::shared_ptr<const KvLayout>& layout, size_t n, uint32_t seed) {
  const PrefixHasher hasher(HashAlgorithm::kSha256,
                            Namespace{kNamespace, layout->fingerprint(), ""}, layout->block_size);
  std::vector<Doc> docs;
  for (size_t i = 0; i < n; ++i) {
    std::vector<uint32_t> tokens(layout->block_size);
    for (size_t t = 0; t < tokens.size(); ++t)
      tokens[t] = static_cast<uint32_t>((seed * 1000003u + i * 7919u + t) % 128256u);
    const auto keys = hasher.keys(tokens, {});
    Doc d{keys[0].hash, {}};
    if (Status st = BlockCodec::encode_document(
            synthetic_block(layout, hasher.identity(keys, 0, {}), i), d.bytes);
        !st.ok()) {
      die(st);
    }
    docs.push_back(std::move(d));
  }
  return docs;
}

uint64_t rss_bytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

// Pins the calling thread (and so the threads it creates from now on) to cores [first, last).
void pin_this_thread(int first, int last) {
  if (first >= last) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c = first; c < last; ++c) CPU_SET(c, &set);
  if (int rc = pthread_setaffinity_np(pthread_self(), sizeof(set), &set); rc != 0) {
    die(internal_error(std::string("pinning a thread: ") + std::strerror(rc)));
  }
}

// CPU seconds (user + system) of this process's live threads, by thread name (for threads that
// live through a run: the publisher's, the pump's).
std::map<std::string, double> cpu_seconds_by_thread() {
  std::map<std::string, double> out;
  DIR* dir = ::opendir("/proc/self/task");
  if (!dir) return out;
  const double tick = 1.0 / static_cast<double>(::sysconf(_SC_CLK_TCK));
  while (const dirent* e = ::readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    const std::string task = std::string("/proc/self/task/") + e->d_name;
    std::string comm, stat;
    std::getline(std::ifstream(task + "/comm"), comm);
    std::getline(std::ifstream(task + "/stat"), stat);
    if (comm.empty() || stat.empty()) continue;  // the thread ended meanwhile
    // Fields after the parenthesised name: state is the 3rd field, utime the 14th, stime 15th.
    std::istringstream rest(stat.substr(stat.rfind(')') + 2));
    std::string field;
    for (int i = 3; i <= 13 && rest >> field; ++i) {
    }
    double utime = 0, stime = 0;
    rest >> utime >> stime;
    out[comm] += (utime + stime) * tick;
  }
  ::closedir(dir);
  return out;
}

struct RunResult {
  double put_rate = 0, get_rate = 0;
  double put_p50 = 0, put_p99 = 0, get_p50 = 0, get_p99 = 0;  // microseconds
  double events_per_s = 0;
  double publisher_cpu = 0;  // the kv-events thread's CPU seconds per second of the run
  double pump_cpu = 0;       // the extra events' pump's, likewise
  uint64_t held_back = 0, dropped_queue_full = 0, ring_bytes = 0, rss = 0;
};

struct Settings {
  std::shared_ptr<const KvLayout> layout;
  uint64_t ram_bytes = 0;
  int clients = 8;
  double seconds = 10;
  bool binary = true;
  std::string ssd_dir;  // set: an SSD tier below RAM (evicted blocks are written: more events)
  // Events/s told to the publisher besides the data path's, through the same queue (as a tier
  // tells them), so the publisher runs at a rate the doors alone do not reach here.
  double extra_events_per_s = 0;
  int server_cores = 0;  // 0: nothing pinned
  int cores = 0;
};

RunResult run(const Settings& s, const std::vector<std::vector<Doc>>& docs, bool events) {
  // Everything the server's side starts from here on inherits its cores.
  pin_this_thread(0, s.server_cores);
  CacheStackOptions so;
  so.layout = s.layout;
  so.ram.capacity_bytes = s.ram_bytes;
  static int run_number = 0;
  const std::string ssd_dir = s.ssd_dir.empty()
                                  ? ""
                                  : s.ssd_dir + "/kv_events_bench-" + std::to_string(::getpid()) +
                                        "-" + std::to_string(++run_number);
  if (!ssd_dir.empty()) {
    SsdTierOptions o;
    o.dir = ssd_dir;
    o.dirs = {o.dir};
    o.capacity_bytes = 1ull << 30;
    o.segment_size = 64ull << 20;
    so.ssd = o;
  }
  if (events) {
    so.kv_events.emplace();
    so.kv_events->endpoint = "tcp://127.0.0.1:*";
  }
  auto stack = must(CacheStack::open(so));
  BlockService service(*stack, HashAlgorithm::kSha256);
  HttpApiOptions http;
  http.threads = 256;
  http.idle_timeout_s = 30;
  HttpApi api(service, http);
  const int port = must(api.bind("127.0.0.1", 0));
  WireServer wire(service, WireServerOptions{});
  api.offer_binary_port(must(wire.bind("127.0.0.1", 0)), false);
  std::thread http_thread([&] { api.run(); });
  std::thread wire_thread([&] { wire.run(); });

  // The subscriber that never reads, with its ZMQ thread on the clients' cores.
  pin_this_thread(s.server_cores, s.cores);
  void* ctx = zmq_ctx_new();
  void* sub = nullptr;
  if (events) {
    sub = zmq_socket(ctx, ZMQ_SUB);
    // Its pipe and socket buffer as small as they go, so the publisher soon finds it full.
    int one = 1, small = 4096;
    zmq_setsockopt(sub, ZMQ_RCVHWM, &one, sizeof(one));
    zmq_setsockopt(sub, ZMQ_RCVBUF, &small, sizeof(small));
    zmq_connect(sub, stack->kv_events()->endpoint().c_str());
    zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "", 0);
  }
  pin_this_thread(0, s.server_cores);

  std::atomic<bool> stop{false};
  std::thread pump;
  if (events && s.extra_events_per_s > 0) {
    pump = std::thread([&] {
      name_this_thread("event-pump");
      auto sink = stack->kv_events()->sink(KvMedium::kRemote);
      BlockHash h, parent;
      std::vector<uint32_t> tokens(s.layout->block_size, 7);
      const auto start = Clock::now();
      uint64_t told = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        const double due =
            std::chrono::duration<double>(Clock::now() - start).count() * s.extra_events_per_s;
        for (; static_cast<double>(told) < due; told += 2) {
          std::memcpy(h.bytes.data(), &told, sizeof(told));
          sink->stored(StoredBlock{h, &parent, tokens, static_cast<uint32_t>(s.layout->block_size),
                                   kNamespace});
          sink->removed(h);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    });
  }
  std::vector<std::vector<double>> put_lat(s.clients), get_lat(s.clients);
  std::vector<std::thread> clients;
  for (int c = 0; c < s.clients; ++c) {
    clients.emplace_back([&, c] {
      pin_this_thread(s.server_cores, s.cores);
      KvtierClient client("127.0.0.1", port);
      client.use_binary(s.binary);
      const std::vector<Doc>& mine = docs[c];
      for (size_t i = 0; !stop.load(std::memory_order_relaxed); ++i) {
        const Doc& d = mine[i % mine.size()];
        auto t0 = Clock::now();
        if (auto r = client.put(d.hash, d.bytes, kNamespace); !r.ok()) die(r.status());
        auto t1 = Clock::now();
        put_lat[c].push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
        // A block this client stored a moment ago: a RAM hit, no event.
        if (auto r = client.get(d.hash, kNamespace); !r.ok()) die(r.status());
        get_lat[c].push_back(std::chrono::duration<double, std::micro>(Clock::now() - t1).count());
      }
    });
  }
  const auto t0 = Clock::now();
  const auto cpu0 = cpu_seconds_by_thread();
  std::this_thread::sleep_for(std::chrono::duration<double>(s.seconds));
  stop = true;
  for (auto& t : clients) t.join();
  const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  auto cpu = cpu_seconds_by_thread();
  for (const auto& [name, seconds] : cpu0) cpu[name] -= seconds;
  const double publisher_cpu = cpu["kv-events"], pump_cpu = cpu["event-pump"];
  if (pump.joinable()) pump.join();

  RunResult out;
  std::vector<double> puts, gets;
  for (int c = 0; c < s.clients; ++c) {
    puts.insert(puts.end(), put_lat[c].begin(), put_lat[c].end());
    gets.insert(gets.end(), get_lat[c].begin(), get_lat[c].end());
  }
  out.put_rate = static_cast<double>(puts.size()) / elapsed;
  out.get_rate = static_cast<double>(gets.size()) / elapsed;
  out.put_p50 = percentile(puts, 0.5);
  out.put_p99 = percentile(puts, 0.99);
  out.get_p50 = percentile(gets, 0.5);
  out.get_p99 = percentile(gets, 0.99);
  out.rss = rss_bytes();
  if (const KvEventPublisher* p = stack->kv_events()) {
    uint64_t n = 0;
    for (size_t m = 0; m < kKvMediums; ++m) {
      n += p->queue().accepted(static_cast<KvMedium>(m), KvEvent::Kind::kStored) +
           p->queue().accepted(static_cast<KvMedium>(m), KvEvent::Kind::kRemoved);
    }
    out.events_per_s = static_cast<double>(n) / elapsed;
    out.publisher_cpu = publisher_cpu / elapsed;
    out.pump_cpu = pump_cpu / elapsed;
    out.held_back = p->metrics().events_held_back.value();
    out.dropped_queue_full = p->queue().dropped_full();
    out.ring_bytes = static_cast<uint64_t>(p->metrics().ring_bytes.value());
  }
  api.stop();
  wire.stop();
  http_thread.join();
  wire_thread.join();
  if (sub) {
    int linger = 0;
    zmq_setsockopt(sub, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_close(sub);
  }
  zmq_ctx_term(ctx);
  stack->close();
  if (!ssd_dir.empty()) std::filesystem::remove_all(ssd_dir);
  pin_this_thread(0, s.cores);
  return out;
}

std::string fixed(double v, int digits = 1) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "kv_events_bench: kvtierd's PUT/GET with and without KV events and a subscriber that never "
      "reads"};
  Settings s;
  int reps = 5;
  size_t docs_per_client = 2048;
  std::string layout_name = "tiny";
  std::string door = "binary";
  std::string json_path = "kv_events_bench.json";
  uint64_t ram_blocks = 1024;
  app.add_option("--reps", reps, "Rounds (each: one run without events, one with)")
      ->capture_default_str();
  app.add_option("--seconds", s.seconds, "Length of one run")->capture_default_str();
  app.add_option("--clients", s.clients, "Client connections")->capture_default_str();
  app.add_option("--layout", layout_name,
                 "KV layout preset, or 'small' (1 layer, 2 KV heads of 64: 8 KiB blocks)")
      ->capture_default_str();
  app.add_option("--ssd-dir", s.ssd_dir, "A directory to put an SSD tier's temporary directory in");
  app.add_option("--door", door, "binary or http")
      ->capture_default_str()
      ->check(CLI::IsMember({"binary", "http"}));
  app.add_option("--ram-blocks", ram_blocks, "RAM tier size in blocks (small: every PUT evicts)")
      ->capture_default_str();
  app.add_option("--docs-per-client", docs_per_client, "Distinct blocks each client cycles through")
      ->capture_default_str();
  app.add_option(
         "--extra-events-per-s", s.extra_events_per_s,
         "Events/s told to the publisher besides the data path's (medium REMOTE), with events on")
      ->capture_default_str();
  s.cores = static_cast<int>(std::thread::hardware_concurrency());
  s.server_cores = s.cores / 2;
  app.add_option("--server-cores", s.server_cores,
                 "The server's side runs on cores [0, K), the clients on [K, all); 0: unpinned")
      ->capture_default_str();
  app.add_option("--json", json_path)->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  init_logging("error");
  if (s.server_cores < 0 || s.server_cores >= s.cores) {
    std::fprintf(stderr, "kv_events_bench: --server-cores must be in [0, %d)\n", s.cores);
    return 2;
  }

  s.layout = layout_name == "small"
                 ? std::make_shared<const KvLayout>(
                       KvLayout::uniform("bench-small", 1, 2, 64, 16, DType::kBF16))
                 : std::make_shared<const KvLayout>(must(layout_preset(layout_name)));
  s.binary = door == "binary";
  s.ram_bytes = ram_blocks * (s.layout->dense_block_bytes() + 4096);
  std::vector<std::vector<Doc>> docs;
  for (int c = 0; c < s.clients; ++c)
    docs.push_back(documents(s.layout, docs_per_client, static_cast<uint32_t>(c + 1)));

  Report report("kv_events_bench: " + door + " door, " + layout_name + " blocks, " +
                    std::to_string(s.clients) + " clients, RAM " + std::to_string(ram_blocks) +
                    " blocks, " + fixed(s.seconds, 0) + " s a run",
                {"round", "events", "PUT/s", "PUT p50 us", "PUT p99 us", "GET/s", "GET p50 us",
                 "GET p99 us", "events/s", "publisher CPU", "pump CPU", "held back",
                 "dropped (queue full)", "ring MiB", "RSS MiB"});
  report.set_meta("machine", machine_description());
  report.add_note(s.server_cores > 0
                      ? "server's side pinned to cores 0-" + std::to_string(s.server_cores - 1) +
                            ", clients and the subscriber to " + std::to_string(s.server_cores) +
                            "-" + std::to_string(s.cores - 1)
                      : "nothing pinned: clients and server share " + std::to_string(s.cores) +
                            " cores");
  report.add_note(
      "publisher CPU, pump CPU: the kv-events thread's and the extra events' pump's CPU seconds "
      "per "
      "second of the run (1.0: one core)");
  report.add_note(
      "events/s counts every event published: the data path's and --extra-events-per-s " +
      fixed(s.extra_events_per_s, 0));
  std::vector<double> off_put, on_put, off_get, on_get, off_put99, on_put99, off_get99, on_get99;
  auto add = [&](int round, bool events, const RunResult& r) {
    report.add_row({std::to_string(round), events ? "on" : "off", fixed(r.put_rate, 0),
                    fixed(r.put_p50), fixed(r.put_p99), fixed(r.get_rate, 0), fixed(r.get_p50),
                    fixed(r.get_p99), events ? fixed(r.events_per_s, 0) : "-",
                    events ? fixed(r.publisher_cpu, 3) : "-", events ? fixed(r.pump_cpu, 3) : "-",
                    events ? std::to_string(r.held_back) : "-",
                    events ? std::to_string(r.dropped_queue_full) : "-",
                    events ? fixed(static_cast<double>(r.ring_bytes) / (1 << 20)) : "-",
                    fixed(static_cast<double>(r.rss) / (1 << 20), 0)});
    (events ? on_put : off_put).push_back(r.put_rate);
    (events ? on_get : off_get).push_back(r.get_rate);
    (events ? on_put99 : off_put99).push_back(r.put_p99);
    (events ? on_get99 : off_get99).push_back(r.get_p99);
  };
  for (int round = 1; round <= reps; ++round) {
    // Alternating which goes first, so a machine that drifts within a round favours neither.
    const bool events_first = round % 2 == 0;
    for (bool events : {events_first, !events_first}) add(round, events, run(s, docs, events));
  }
  report.add_note("PUT rate with events / without, round by round: " +
                  paired_rate_ratio(off_put, on_put).text());
  report.add_note("GET rate with events / without, round by round: " +
                  paired_rate_ratio(off_get, on_get).text());
  report.add_note("PUT p99 with / without (1.0: no slower): " +
                  paired_ratio(on_put99, off_put99).text());
  report.add_note("GET p99 with / without: " + paired_ratio(on_get99, off_get99).text());
  report.print();
  if (!report.write_json(json_path))
    std::fprintf(stderr, "kv_events_bench: could not write %s\n", json_path.c_str());
  return 0;
}
