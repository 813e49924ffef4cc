#include "server/server_options.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "base/build_info.h"
#include "base/byte_size.h"
#include "base/log.h"

namespace kvtier {
namespace {

using nlohmann::json;

// The flags as strings: sizes and enums are parsed after CLI11 so that each error names its flag
// and says what would have been accepted.
struct RawFlags {
  std::string host = "127.0.0.1";
  int port = 8417;
  std::string layout = "llama-3-8b";
  std::string hybrid_layout;
  std::string ram_capacity = "4G";
  std::string eviction = "auto";
  std::string ssd_admission = "all";
  std::string ssd_write_budget;
  std::vector<std::string> ssd_cache_dirs;
  std::string ssd_capacity = "64G";
  std::string ssd_segment_size = "256M";
  bool ssd_reset = false;
  std::string gpu_memory = "0";
  std::string remote;
  std::string hash = "sha256";
  std::string compression = "none";
  std::string kv_cache_quantization = "off";
  std::string api_key;
  std::string api_keys;
  std::string tls_cert;
  std::string tls_key;
  std::string log_level = "info";
  int threads = 4096;
  int idle_timeout_s = 5;
  std::string binary_port = "auto";
  int max_connections_per_client = 256;
  int request_timeout_s = 30;
  std::string max_body_memory = "256M";
  double shutdown_timeout_s = 30;
  bool persist_on_shutdown = true;
  std::string log_format = "text";
  std::string kv_events;
  std::string kv_events_replay;
  std::string kv_events_topic = "kv-events";
  size_t kv_events_queue = 100000;
  size_t kv_events_replay_buffer = 10000;
  std::string access_log;
  double access_log_sample = 1.0;
  std::string config;
};

void add_flags(CLI::App& app, RawFlags& f) {
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--host", f.host, "Address to listen on")->capture_default_str();
  app.add_option("--port", f.port, "TCP port (0 picks a free one)")->capture_default_str()
      ->check(CLI::Range(0, 65535));
  app.add_option("--layout", f.layout,
                 "KV layout: a preset (llama-3-8b, qwen3-0.6b, tiny) or a layout JSON file")
      ->capture_default_str();
  app.add_option("--hybrid-layout", f.hybrid_layout,
                 "A hybrid model's layout JSON file (Gated DeltaNet layers beside attention): replaces --layout "
                 "with its attention layers'; GDN state snapshots at /v1/states");
  app.add_option("--ram-capacity", f.ram_capacity, "Host RAM tier size, e.g. 512M, 8G")
      ->capture_default_str();
  app.add_option(
         "--eviction", f.eviction,
         "RAM tier eviction: auto (adaptive for RAM alone, chain-lru above an SSD or remote tier), "
         "chain-lru (LRU, leaves and orphans first), lru, s3fifo, s3fifo-chain or adaptive "
         "(chain-lru "
         "or s3fifo, whichever hits more lately)")
      ->capture_default_str();
  app.add_option("--ssd-admission", f.ssd_admission,
                 "Which blocks leaving RAM are written to the SSD: all, or seen-twice (used at least twice)")
      ->capture_default_str();
  app.add_option("--ssd-write-budget", f.ssd_write_budget,
                 "Bytes a day the SSD tier may write (e.g. 3.5T/day: one drive-write a day of a "
                 "3.5 TB drive); "
                 "admission tightens as it runs out, refusals counted. Off by default");
  app.add_option("--ssd-cache-dir", f.ssd_cache_dirs,
                 "Directory of the SSD tier; turns the SSD tier on (without it there is none). "
                 "Give it once per drive (repeated, or comma-separated) to stripe the tier over them")
      ->delimiter(',');
  app.add_option("--ssd-capacity", f.ssd_capacity,
                 "SSD tier size, split evenly over its directories")->capture_default_str();
  app.add_option("--ssd-segment-size", f.ssd_segment_size,
                 "Segment file size of a new SSD directory")->capture_default_str();
  app.add_flag("--ssd-reset", f.ssd_reset, "Wipe the SSD tier's cache on start (on purpose)");
  app.add_option("--gpu-memory", f.gpu_memory, "GPU tier size (0 = no GPU tier)")
      ->capture_default_str();
  app.add_option("--remote", f.remote,
                 "Redis Cluster (or one Redis) shared by several hosts, below the SSD: "
                 "redis://[user:password@]host:port[,host:port...]");
  app.add_option("--hash", f.hash, "Prefix hash: sha256 or xxh3")->capture_default_str();
  app.add_option("--compression", f.compression, "SSD record codec: none, lz4 or lz4-shuffle")
      ->capture_default_str();
  app.add_option("--kv-cache-quantization", f.kv_cache_quantization,
                 "Quantize blocks held in RAM: off, 8 or 4 (bits; group size 64)")
      ->capture_default_str();
  app.add_option("--api-key", f.api_key,
                 "Require 'Authorization: Bearer KEY' on every route but /healthz "
                 "(default: $KVTIER_API_KEY)");
  app.add_option("--api-keys", f.api_keys,
                 "JSON file of tenants: each key's namespaces (or admin), and per-namespace RAM quotas");
  app.add_option("--tls-cert", f.tls_cert, "PEM certificate (chain); with --tls-key the server speaks HTTPS only");
  app.add_option("--tls-key", f.tls_key, "PEM private key of --tls-cert");
  app.add_option("--log-level", f.log_level, "trace, debug, info, warn, error or off")
      ->capture_default_str();
  app.add_option("--log-format", f.log_format, "text, or json: one JSON object a line")
      ->capture_default_str()->check(CLI::IsMember({"text", "json"}));
  app.add_option("--threads", f.threads,
                 "Connections served at once, a thread each, started when a connection arrives; "
                 "more wait for a free one")
      ->capture_default_str()->check(CLI::Range(1, 65536));
  app.add_option("--idle-timeout", f.idle_timeout_s,
                 "Seconds a connection may wait before sending its next request; then it is closed")
      ->capture_default_str()->check(CLI::Range(1, 3600));
  app.add_option("--binary-port", f.binary_port,
                 "Port of the binary block protocol: auto (the HTTP port + 1), off, or a number; inside TLS with --tls-cert")
      ->capture_default_str();
  app.add_option("--max-connections-per-client", f.max_connections_per_client,
                 "Connections one client address may hold on each port (HTTP, binary); more are refused with a 503")
      ->capture_default_str()->check(CLI::Range(1, 1 << 20));
  app.add_option("--request-timeout", f.request_timeout_s,
                 "Seconds a request (TLS handshake, headers, body) may take to arrive, or a reply's write may wait for the "
                 "client to read; then the connection closes")
      ->capture_default_str()->check(CLI::Range(1, 3600));
  app.add_option("--max-body-memory", f.max_body_memory,
                 "Bytes of request bodies held at once, all connections of both ports together, before they are "
                 "stored; a body that finds no room within a second is refused with a 503")
      ->capture_default_str();
  app.add_option("--shutdown-timeout", f.shutdown_timeout_s,
                 "Seconds to spend draining and persisting to the SSD on SIGINT/SIGTERM")
      ->capture_default_str()->check(CLI::Range(0.0, 3600.0));
  app.add_flag("--persist-on-shutdown,!--no-persist-on-shutdown", f.persist_on_shutdown,
               "At shutdown, write blocks only RAM holds to the SSD so a restart serves them");
  app.add_option("--kv-events", f.kv_events,
                 "Publish every block entering and leaving a tier, in vLLM's KV-event format over "
                 "ZeroMQ, on this "
                 "endpoint (bound), e.g. tcp://127.0.0.1:5557 or tcp://*:5557");
  app.add_option(
      "--kv-events-replay", f.kv_events_replay,
      "Endpoint (bound) of the replay socket that answers subscribers who missed batches");
  app.add_option("--kv-events-topic", f.kv_events_topic, "Topic frame of every event batch")
      ->capture_default_str();
  app.add_option("--kv-events-queue", f.kv_events_queue,
                 "Events waiting to be published; beyond this they are dropped and counted")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{1} << 30));
  app.add_option("--kv-events-replay-buffer", f.kv_events_replay_buffer,
                 "Batches the replay socket keeps")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{1} << 24));
  app.add_option(
      "--access-log", f.access_log,
      "Write one JSON line per HTTP request to this file ('-': stderr); off when not given");
  app.add_option("--access-log-sample", f.access_log_sample,
                 "Fraction of requests the access log writes")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--config", f.config, "JSON file with the same keys as the long flags");
}

// `--config FILE` or `--config=FILE` anywhere on the command line.
std::string find_config_path(const std::vector<std::string>& args) {
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "--config" && i + 1 < args.size()) return args[i + 1];
    if (args[i].rfind("--config=", 0) == 0) return args[i].substr(9);
  }
  return "";
}

// The config file as flags, to be parsed before the command line's (which then win).
// A key the command line also sets is left out, so the command line's value replaces the file's
// (for an option given several times, such as --ssd-cache-dir, the two would add up otherwise).
Result<std::vector<std::string>> config_as_flags(const std::string& path, CLI::App& app,
                                                 const std::vector<std::string>& args) {
  std::ifstream in(path);
  if (!in) return invalid_argument("--config: cannot read " + path);
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return invalid_argument("--config: " + path + " is not a JSON object");
  }
  std::vector<std::string> flags;
  for (auto it = j.begin(); it != j.end(); ++it) {
    std::string key = it.key();
    for (char& c : key) c = c == '_' ? '-' : c;
    const CLI::Option* opt = key == "config" ? nullptr : app.get_option_no_throw("--" + key);
    if (!opt) return invalid_argument("--config: unknown key '" + it.key() + "' in " + path);
    const bool on_command_line = std::any_of(args.begin(), args.end(), [&](const std::string& a) {
      return a == "--" + key || a.rfind("--" + key + "=", 0) == 0;
    });
    if (on_command_line) continue;
    const json& v = it.value();
    if (v.is_array() && key == "ssd-cache-dir") {
      for (const json& e : v) {
        if (!e.is_string()) return invalid_argument("--config: '" + it.key() + "' must list strings");
        flags.push_back("--" + key);
        flags.push_back(e.get<std::string>());
      }
    } else if (v.is_boolean()) {
      flags.push_back("--" + key + "=" + (v.get<bool>() ? "true" : "false"));
    } else if (v.is_string() || v.is_number()) {
      flags.push_back("--" + key);
      flags.push_back(v.is_string() ? v.get<std::string>() : v.dump());
    } else {
      return invalid_argument("--config: key '" + it.key() + "' must be a string, number or boolean");
    }
  }
  return flags;
}

Result<uint64_t> size_flag(const char* flag, const std::string& text) {
  auto v = parse_byte_size(text);
  if (!v.ok()) return invalid_argument(std::string(flag) + ": " + v.status().message());
  return *v;
}

Result<ServerOptions> resolve(const RawFlags& f) {
  ServerOptions o;
  o.host = f.host;
  o.port = f.port;
  o.layout = f.layout;
  if (!f.hybrid_layout.empty()) {
    std::ifstream in(f.hybrid_layout);
    if (!in) return invalid_argument("--hybrid-layout: cannot read " + f.hybrid_layout);
    std::stringstream text;
    text << in.rdbuf();
    auto h = HybridLayout::from_json_text(text.str());
    if (!h.ok()) return invalid_argument("--hybrid-layout: " + h.status().message());
    if (h->gdn_layers() == 0) return invalid_argument("--hybrid-layout: no GDN layer (use --layout)");
    o.hybrid_layout_file = f.hybrid_layout;
    o.hybrid = std::move(h).value();
    o.resolved_layout = std::make_shared<const KvLayout>(o.hybrid->attention());
  } else {
    auto layout = resolve_layout(f.layout);
    if (!layout.ok()) return invalid_argument("--layout: " + layout.status().message());
    o.resolved_layout = std::make_shared<const KvLayout>(std::move(layout).value());
  }
  KVTIER_ASSIGN_OR_RETURN(o.ram_capacity, size_flag("--ram-capacity", f.ram_capacity));
  KVTIER_ASSIGN_OR_RETURN(o.ssd_capacity, size_flag("--ssd-capacity", f.ssd_capacity));
  KVTIER_ASSIGN_OR_RETURN(o.ssd_segment_size, size_flag("--ssd-segment-size", f.ssd_segment_size));
  KVTIER_ASSIGN_OR_RETURN(o.gpu_memory, size_flag("--gpu-memory", f.gpu_memory));
  const uint64_t block = o.resolved_layout->dense_block_bytes();
  KVTIER_ASSIGN_OR_RETURN(o.max_body_memory, size_flag("--max-body-memory", f.max_body_memory));
  if (o.max_body_memory < block + (16ull << 20)) {
    return invalid_argument("--max-body-memory: " + format_byte_size(o.max_body_memory) +
                            " cannot hold one body of the largest size a door accepts (" +
                            format_byte_size(block + (16ull << 20)) + ")");
  }
  if (o.ram_capacity < 2 * block) {
    return invalid_argument("--ram-capacity: " + format_byte_size(o.ram_capacity) +
                            " holds fewer than two blocks of this layout (" + format_byte_size(block) +
                            " each)");
  }
  if (auto p = make_eviction_policy(f.eviction); !p.ok()) return invalid_argument("--eviction: " + p.status().message());
  o.eviction = f.eviction;
  if (auto a = make_admission_policy(f.ssd_admission); !a.ok()) {
    return invalid_argument("--ssd-admission: " + a.status().message());
  }
  o.ssd_admission = f.ssd_admission;
  if (!f.ssd_write_budget.empty()) {
    std::string budget = f.ssd_write_budget;
    if (const size_t slash = budget.find('/'); slash != std::string::npos) {
      if (budget.substr(slash) != "/day" && budget.substr(slash) != "/d") {
        return invalid_argument("--ssd-write-budget: '" + f.ssd_write_budget +
                                "': a size a day, such as 2T/day or 500G");
      }
      budget.resize(slash);
    }
    KVTIER_ASSIGN_OR_RETURN(o.ssd_write_budget, size_flag("--ssd-write-budget", budget));
    if (o.ssd_write_budget == 0)
      return invalid_argument(
          "--ssd-write-budget: a budget of 0 writes nothing; leave the SSD tier off instead");
    if (f.ssd_cache_dirs.empty())
      return invalid_argument("--ssd-write-budget: there is no SSD tier (--ssd-cache-dir)");
  }
  o.ssd_cache_dirs = f.ssd_cache_dirs;
  const uint64_t ssd_dirs = o.ssd_cache_dirs.size();
  if (ssd_dirs > 0 && o.ssd_capacity < 2 * o.ssd_segment_size * ssd_dirs) {
    return invalid_argument("--ssd-capacity: must hold at least two segments of " +
                            format_byte_size(o.ssd_segment_size) +
                            (ssd_dirs > 1 ? " per directory (" + std::to_string(ssd_dirs) + " given)" : ""));
  }
  if (ssd_dirs > 0 && o.ssd_segment_size < 2 * block + (1 << 20)) {
    return invalid_argument("--ssd-segment-size: too small for blocks of " + format_byte_size(block));
  }
  o.ssd_reset = f.ssd_reset;
  if (!f.remote.empty()) {
    auto remote = RedisAddress::parse(f.remote);
    if (!remote.ok()) return invalid_argument("--remote: " + remote.status().message());
    o.remote = f.remote;
  }
  auto hash = parse_hash_algorithm(f.hash);
  if (!hash.ok()) return invalid_argument("--hash: " + hash.status().message());
  o.hash = *hash;
  auto codec = parse_frame_codec(f.compression);
  if (!codec.ok()) return invalid_argument("--compression: " + codec.status().message());
  o.compression = *codec;
  if (f.kv_cache_quantization == "8" || f.kv_cache_quantization == "4") {
    o.kv_cache_quantization = std::stoi(f.kv_cache_quantization);
  } else if (f.kv_cache_quantization != "off") {
    return invalid_argument("--kv-cache-quantization: '" + f.kv_cache_quantization +
                            "' is not off, 8 or 4");
  }
  o.api_key = f.api_key;
  if (!f.api_keys.empty()) {
    if (!o.api_key.empty()) return invalid_argument("--api-key and --api-keys: give one of them (the file can hold an admin key)");
    auto table = TenantTable::load(f.api_keys);
    if (!table.ok()) return invalid_argument("--api-keys: " + table.status().message());
    o.api_keys_file = f.api_keys;
    o.tenants = std::make_shared<const TenantTable>(std::move(table).value());
  } else {
    if (o.api_key.empty()) {
      if (const char* env = std::getenv("KVTIER_API_KEY")) o.api_key = env;
    }
    if (!o.api_key.empty()) o.tenants = std::make_shared<const TenantTable>(TenantTable::single_admin_key(o.api_key));
  }
  if (f.tls_cert.empty() != f.tls_key.empty()) {
    return invalid_argument(f.tls_cert.empty() ? "--tls-key needs --tls-cert" : "--tls-cert needs --tls-key");
  }
  for (const auto& [flag, path] : {std::pair{"--tls-cert", &f.tls_cert}, std::pair{"--tls-key", &f.tls_key}}) {
    if (!path->empty() && !std::ifstream(*path)) return invalid_argument(std::string(flag) + ": cannot read " + *path);
  }
  o.tls_cert = f.tls_cert;
  o.tls_key = f.tls_key;
  o.log_level = f.log_level;
  static const char* kLevels[] = {"trace", "debug", "info", "warn", "error", "off"};
  if (std::find(std::begin(kLevels), std::end(kLevels), o.log_level) == std::end(kLevels)) {
    return invalid_argument("--log-level: '" + o.log_level +
                            "' is not trace, debug, info, warn, error or off");
  }
  o.log_format = f.log_format == "json" ? LogFormat::kJson : LogFormat::kText;
  o.threads = f.threads;
  o.idle_timeout_s = f.idle_timeout_s;
  o.max_connections_per_client = f.max_connections_per_client;
  o.request_timeout_s = f.request_timeout_s;
  if (f.binary_port == "off") {
    o.binary_port.reset();
  } else if (f.binary_port == "auto") {
    o.binary_port = -1;
  } else {
    char* end = nullptr;
    const long port = std::strtol(f.binary_port.c_str(), &end, 10);
    if (f.binary_port.empty() || *end != '\0' || port < 0 || port > 65535) {
      return invalid_argument("--binary-port: '" + f.binary_port + "' is not auto, off or a port number");
    }
    o.binary_port = static_cast<int>(port);
  }
  o.shutdown_timeout = std::chrono::milliseconds(static_cast<int64_t>(f.shutdown_timeout_s * 1000));
  o.persist_on_shutdown = f.persist_on_shutdown;
  if (!f.kv_events_replay.empty() && f.kv_events.empty()) {
    return invalid_argument(
        "--kv-events-replay needs --kv-events (the endpoint whose batches it replays)");
  }
  for (const std::string* e : {&f.kv_events, &f.kv_events_replay}) {
    if (!e->empty() && e->find("://") == std::string::npos) {
      return invalid_argument("--kv-events: '" + *e +
                              "' is not a ZeroMQ endpoint (tcp://HOST:PORT, ipc://PATH)");
    }
  }
  if (!f.kv_events.empty()) {
    KvEventsOptions k;
    k.endpoint = f.kv_events;
    k.replay_endpoint = f.kv_events_replay;
    k.topic = f.kv_events_topic;
    k.queue_events = f.kv_events_queue;
    k.replay_batches = f.kv_events_replay_buffer;
    o.kv_events = k;
  }
  o.access_log = f.access_log;
  o.access_log_sample = f.access_log_sample;
  return o;
}

}  // namespace

ParsedCommandLine parse_server_command_line(int argc, const char* const* argv, std::ostream& out,
                                            std::ostream& err) {
  CLI::App app{"kvtierd: a tiered KV cache (GPU, RAM, SSD) for LLM inference servers"};
  app.set_version_flag("--version", version_text("kvtierd"));
  RawFlags flags;
  add_flags(app, flags);

  std::vector<std::string> args(argv, argv + argc);
  std::vector<std::string> merged{args.empty() ? "kvtierd" : args[0]};
  if (const std::string config = find_config_path(args); !config.empty()) {
    auto from_config = config_as_flags(config, app, args);
    if (!from_config.ok()) {
      err << "kvtierd: " << from_config.status().message() << "\n";
      return {std::nullopt, 2};
    }
    merged.insert(merged.end(), from_config->begin(), from_config->end());
  }
  merged.insert(merged.end(), args.begin() + (args.empty() ? 0 : 1), args.end());
  std::vector<const char*> cargv;
  for (const std::string& a : merged) cargv.push_back(a.c_str());

  try {
    app.parse(static_cast<int>(cargv.size()), cargv.data());
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e, out, err);
    return {std::nullopt, code == 0 ? 0 : 2};
  }
  auto resolved = resolve(flags);
  if (!resolved.ok()) {
    err << "kvtierd: " << resolved.status().message() << "\n";
    return {std::nullopt, 2};
  }
  return {std::move(resolved).value(), 0};
}

CacheStackOptions cache_stack_options(const ServerOptions& o) {
  CacheStackOptions c;
  c.layout = o.resolved_layout;
  c.gpu_pool.byte_budget = o.gpu_memory;
  c.ram.capacity_bytes = o.ram_capacity;
  c.ram.eviction = o.eviction;
  c.ssd_admission = o.ssd_admission;
  c.ssd_write_budget = o.ssd_write_budget;
  if (o.tenants) {
    for (const auto& [ns, q] : o.tenants->quotas()) {
      if (q.ram_bytes) c.ram.namespace_quotas[ns] = *q.ram_bytes;
    }
  }
  if (o.kv_cache_quantization) c.ram.quantization = Quantization{*o.kv_cache_quantization, 64};
  if (!o.ssd_cache_dirs.empty()) {
    SsdTierOptions s;
    s.dir = o.ssd_cache_dirs.front();
    s.dirs = o.ssd_cache_dirs;
    s.capacity_bytes = o.ssd_capacity;
    s.segment_size = o.ssd_segment_size;
    s.codec = o.compression;
    if (o.tenants) {
      for (const auto& [ns, q] : o.tenants->quotas()) {
        if (q.ssd_bytes) s.namespace_quotas[ns] = *q.ssd_bytes;
      }
    }
    s.reset = o.ssd_reset;
    s.drain_timeout = o.shutdown_timeout;
    c.ssd = s;
  }
  c.kv_events = o.kv_events;
  if (!o.remote.empty()) {
    RemoteTierOptions r;
    r.address = *RedisAddress::parse(o.remote);  // checked when the flags were read
    c.remote = r;
  }
  return c;
}

}  // namespace kvtier
