// RedisCluster: the remote tier's client for a Redis Cluster (or one standalone Redis), on our own
// RESP connections (Debian ships no cluster client). What it does:
//   - the slot map from CLUSTER SLOTS (any seed or known node answers), refreshed after a MOVED,
//     after a node fails, and while no map is known (at most every `refresh_interval`);
//   - one connection per master, opened lazily and reopened after `reconnect_backoff`;
//   - batches: each key's command goes to the master of its slot (CRC16, hash tags honoured); the
//     commands of one node are pipelined (a window of them in flight), and every node gets its
//     first window before any reply is read, so the nodes work in parallel;
//   - MOVED (the slot has a new owner: follow it and refresh the map) and ASK (follow once, after
//     ASKING) redirects, up to two per key;
//   - a standalone Redis (cluster support disabled) serves every slot.
// What it does not: read from replicas, or pick up topology changes without a MOVED or a failure.
// A failed node's keys fail with kUnavailable: the remote tier reads that as a miss.
// Thread-safe; each connection has its own mutex, taken in node order.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "tiers/remote/redis_address.h"
#include "tiers/remote/redis_connection.h"

namespace kvtier {

inline constexpr int kRedisSlots = 16384;
// Redis's CRC16 (XMODEM) of the key or of its {hash tag}, mod 16384.
int redis_key_slot(std::string_view key);

struct RedisClusterOptions {
  RedisAddress address;
  RedisTimeouts timeouts;
  RespReaderOptions reader;  // how every connection reads replies
  std::chrono::milliseconds reconnect_backoff{1000};  // after a node failed to connect
  std::chrono::milliseconds refresh_interval{500};    // the least time between two slot-map refreshes
};

// Per-node outcomes, for the tier's metrics.
struct RedisNodeStats {
  std::string endpoint;
  uint64_t commands = 0;
  uint64_t failures = 0;  // commands that failed on the transport
  uint64_t bytes_in = 0;  // reply payload bytes
};

class RedisCluster {
 public:
  // Reads the slot map from the first seed that answers. Unreachable seeds are not an error (the
  // client starts empty and keeps trying); credentials a node refuses are (kFailedPrecondition).
  static Result<std::unique_ptr<RedisCluster>> open(RedisClusterOptions options);
  ~RedisCluster();

  // Runs `commands` (argv[1] of each is its key) and returns each one's reply in order, or the
  // Status of a command that could not be run (node down, no slot owner, redirects exhausted).
  // At most `window` commands are in flight on each node: small for large values (GET, SET of
  // blocks), unbounded for small ones (EXISTS, DEL).
  std::vector<Result<RedisReply>> execute(std::span<const RedisCommand> commands, size_t window = SIZE_MAX);
  // The same, handing each command's outcome to `sink` (index, reply) as it arrives, so a large
  // value can be consumed and freed at once instead of being held until the batch ends. `sink`
  // runs with node connections locked: it must not call this client.
  using ReplySink = std::function<void(size_t, Result<RedisReply>)>;
  void execute(std::span<const RedisCommand> commands, size_t window, const ReplySink& sink);

  bool has_slot_map() const;
  bool standalone() const;
  std::vector<RedisNodeStats> node_stats() const;
  // Slot-map refreshes done, and those that found no node to answer.
  uint64_t refreshes() const;
  uint64_t refresh_failures() const;

 private:
  struct Node;
  explicit RedisCluster(RedisClusterOptions options);
  // Re-reads the slot map unless one was read less than refresh_interval ago (or `force`).
  Status refresh(bool force);
  Status refresh_from(Node& node);
  // The node at `endpoint`, added if new. Caller holds no node lock.
  size_t node_index(const RedisEndpoint& endpoint);
  // A live connection of `node` (opening one if allowed); caller holds node.mu.
  Status connect(Node& node);
  int owner(int slot) const;

  const RedisClusterOptions options_;
  mutable std::shared_mutex map_mu_;  // guards slots_, standalone_, has_map_, last_refresh_
  std::array<int16_t, kRedisSlots> slots_{};  // node index, -1 = unknown
  bool standalone_ = false;
  bool has_map_ = false;
  std::chrono::steady_clock::time_point last_refresh_{};
  std::mutex refresh_mu_;  // one refresh at a time
  mutable std::mutex nodes_mu_;  // guards nodes_ (the vector; each Node has its own mutex)
  std::vector<std::unique_ptr<Node>> nodes_;  // grows only: indices stay valid
  std::atomic<uint64_t> refreshes_{0}, refresh_failures_{0};
};

}  // namespace kvtier
