// AccessLog: one JSON line per HTTP request, for operators who want per-request cache telemetry
// (who asked, what was found where, how long it took) without a tracing stack. Off unless
// --access-log names a file ("-": stderr); --access-log-sample writes that fraction of requests
// (each line says its sample rate, so sums can be scaled back). The format is documented in
// docs/operations.md ("Access log"):
//
//   {"ts": "2026-11-27T12:00:00.123Z", "request_id": "...", "tenant": "alice" | null,
//    "namespace": "m1", "method": "POST", "route": "lookup", "status": 200,
//    "tokens": 4096, "matched_tokens": 2048,                       (lookup, prefetch)
//    "tiers": [{"tier": "gpu", "first_block": 0, "blocks": 100}, ...],  (the matched prefix)
//    "hash": "<64 hex>",                                          (block routes)
//    "bytes_in": 123, "bytes_out": 456, "latency_ms": 0.42, "sample_rate": 1.0}
#pragma once

#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "base/log.h"
#include "base/metrics/metrics.h"
#include "base/status.h"

namespace kvtier {

// What a route found out about its request, for its line.
struct AccessNote {
  std::string ns;
  std::optional<size_t> tokens;
  std::optional<size_t> matched_tokens;
  struct TierRun {
    std::string tier;
    size_t first_block = 0;
    size_t blocks = 0;
  };
  std::vector<TierRun> tiers;  // the matched prefix, as runs of blocks in one tier
  std::string hash;            // hex, for the routes addressed by a block's hash
  uint64_t streamed_bytes = 0;  // a streamed (chunked) reply's body, counted as it is written
  // Appends block `index` (in prefix order) found in `tier`.
  void add_block(const std::string& tier, size_t index);
};

struct AccessLine {
  std::string request_id;
  const std::string* tenant = nullptr;  // null: auth is off or the key was not known
  std::string method;
  std::string route;
  int status = 0;
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
  double latency_seconds = 0;
  const AccessNote* note = nullptr;
};

// Thread-safe: lines are written whole, one write each.
class AccessLog {
 public:
  // "-" is stderr; a file is opened for appending (created 0640 if absent).
  static Result<std::unique_ptr<AccessLog>> open(const std::string& path, double sample_rate);
  ~AccessLog();

  // Whether this request gets a line (drawn at random at the sample rate); counted.
  bool sampled();
  void write(const AccessLine& line);
  // A request id for a request that brought none.
  std::string next_request_id();

  void visit_metrics(MetricVisitor& visitor) const;

 private:
  AccessLog(std::FILE* file, bool owned, double sample_rate, std::string path);

  std::mutex mu_;  // guards writes to file_
  std::FILE* file_;
  bool owned_;
  double sample_rate_;
  std::string path_;
  std::string id_prefix_;
  std::atomic<uint64_t> next_id_{0};
  Counter lines_;
  Counter sampled_out_;
  Counter write_failures_;
  LogThrottle failure_log_;
};

}  // namespace kvtier
