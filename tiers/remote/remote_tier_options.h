// RemoteTierOptions and RemoteTierMetrics: what the remote tier's reads (RemoteTier) and its
// writes (RemoteWriteBehind) are configured with and count.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "base/metrics/metrics.h"
#include "serialize/block_hash.h"
#include "tiers/remote/redis_cluster.h"

namespace kvtier {

struct RemoteTierOptions {
  RedisAddress address;
  std::string key_prefix = "kvtier:";
  uint64_t write_queue_bytes = 256ull << 20;  // blocks waiting for the writer
  size_t write_batch_blocks = 16;             // SETs per pipelined batch
  // Block values (GET, SET) in flight on one node at a time (every node works at once): Redis
  // copies pipelined values into its buffers, so deeper pipelines of 2 MiB values ran slower
  // (remote_bench: 1 in flight 2.13 GB/s, 4 in flight 1.56, 16 in flight 0.71 on the H100 host).
  size_t values_in_flight_per_node = 1;
  RedisTimeouts timeouts;
  std::chrono::milliseconds reconnect_backoff{1000};
  // A failed SET is tried again after retry_backoff, doubling up to retry_backoff_max, for at
  // most write_retry_window after its first failure.
  std::chrono::milliseconds retry_backoff{250};
  std::chrono::milliseconds retry_backoff_max{5000};
  std::chrono::milliseconds write_retry_window{120000};
};

struct RemoteTierMetrics {
  Counter hits;
  Counter misses;              // not there (including what Redis evicted)
  Counter read_errors;         // Redis unreachable or failing: read as misses
  Counter read_bytes;
  Counter corrupt;             // values that failed a check: deleted, never served
  Counter written_blocks;
  Counter written_bytes;
  Counter write_errors;        // SETs that failed (each is retried, or dropped with a reason below)
  Counter retried_written;     // written on a retry, after failing before
  Counter dropped_retries_expired;    // still failing after write_retry_window
  Counter dropped_not_held_locally;   // failed, and no local tier holds it any more
  Counter dropped_retry_displaced;    // a failed block's room went to a fresh one
  Counter dropped_queue_full;  // not queued: the writer is behind
  Counter dropped_encode_failed;
  Counter dropped_shutdown;    // still queued at close
  Counter skipped_already_written;
  Counter exists_errors;       // lookups that could not ask Redis: read as misses
  Gauge queue_bytes;
  Gauge queue_blocks;
  Gauge retry_blocks;          // failed SETs waiting for their next try
  Histogram read_seconds;      // one pipelined GET batch
  Histogram write_seconds;     // one pipelined SET batch
  Histogram exists_seconds;    // one pipelined EXISTS batch (a lookup's remote part)
};

// A block's key in Redis: the hash already folds in the namespace and layout, and a GET by hash
// does not know the namespace, so the key cannot carry it.
inline std::string remote_key(std::string_view prefix, const BlockHash& hash) {
  return std::string(prefix) + hash.hex();
}

}  // namespace kvtier
