// kvtierd's settings: every command-line flag, the same keys in a --config JSON file, and their
// checks. Parsing happens before anything starts, so a bad size or an unknown preset is one clear
// message and exit status 2, never a half-started server.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "base/log.h"
#include "base/status.h"
#include "cache/cache_stack.h"
#include "cache/prefix_hasher.h"
#include "serialize/hybrid_layout.h"
#include "server/tenant_table.h"

namespace kvtier {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8417;
  std::string layout = "llama-3-8b";  // a preset name or a KvLayout JSON file
  uint64_t ram_capacity = 4ull << 30;
  std::string eviction = "chain-lru";  // the RAM tier's policy (tiers/policy)
  std::string ssd_admission = "all";   // which blocks leaving RAM are written to the SSD
  uint64_t ssd_write_budget = 0;       // bytes a day the SSD tier may write (0: no budget)
  std::vector<std::string> ssd_cache_dirs;  // one per drive; empty: no SSD tier
  uint64_t ssd_capacity = 64ull << 30;
  uint64_t ssd_segment_size = 256ull << 20;
  bool ssd_reset = false;
  uint64_t gpu_memory = 0;            // 0: no GPU tier
  std::string remote;                 // redis://...: a tier shared with other hosts; empty: none
  HashAlgorithm hash = HashAlgorithm::kSha256;
  FrameCodec compression = FrameCodec::kNone;
  std::optional<int> kv_cache_quantization;  // bits; group size 64
  std::string api_key;                // one admin key (or $KVTIER_API_KEY)
  std::string api_keys_file;          // tenants: keys, their namespaces, quotas
  std::string tls_cert;               // PEM certificate chain; with tls_key: HTTPS only
  std::string tls_key;                // PEM private key
  std::string log_level = "info";
  LogFormat log_format = LogFormat::kText;
  int threads = 4096;                 // connections served at once (a thread each, started on demand)
  int idle_timeout_s = 5;             // a connection that sends no request for this long is closed
  // The binary data plane (server/wire): -1 the HTTP port + 1 (any free port when --port is 0),
  // 0 any free port, otherwise the port; nullopt: off (always with TLS: it speaks only TCP).
  std::optional<int> binary_port = -1;
  int max_connections_per_client = 256;  // binary port: per client address
  int request_timeout_s = 30;            // binary port: a whole request read, or a reply written
  uint64_t max_body_memory = 256ull << 20;  // request bodies held at once, both doors
  std::chrono::milliseconds shutdown_timeout{30000};  // draining and persisting at shutdown
  bool persist_on_shutdown = true;    // write RAM-only blocks to the SSD at shutdown
  std::optional<KvEventsOptions> kv_events;  // --kv-events: publish block events for routers
  std::string access_log;                    // a file, "-" for stderr; empty: no access log
  double access_log_sample = 1.0;            // the fraction of requests it writes

  std::shared_ptr<const KvLayout> resolved_layout;  // --layout, loaded and validated
  std::string hybrid_layout_file;                   // --hybrid-layout
  std::optional<HybridLayout> hybrid;               // loaded; resolved_layout is its attention part
  std::shared_ptr<const TenantTable> tenants;       // from --api-keys or --api-key; null: no auth
};

// Either settings to run with, or an exit code (0 after --help/--version, 2 for an error, with
// the message already written to `err`).
struct ParsedCommandLine {
  std::optional<ServerOptions> options;
  int exit_code = 0;
};

// Reads flags, then `--config FILE.json` (its keys are the long flag names without dashes;
// flags given on the command line win), then KVTIER_API_KEY when --api-key is absent.
ParsedCommandLine parse_server_command_line(int argc, const char* const* argv, std::ostream& out,
                                            std::ostream& err);

// The tier stack the settings describe (the Vulkan context is the caller's, for --gpu-memory).
CacheStackOptions cache_stack_options(const ServerOptions& o);

}  // namespace kvtier
