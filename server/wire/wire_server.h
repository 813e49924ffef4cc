// WireServer: kvtierd's binary data plane (wire_format.h) on its own port. It owns its accept
// loop, so it does what cpp-httplib cannot: cap connections per client address, close a
// connection that sends nothing for --idle-timeout without waking it every 10 ms, and bound
// every request by a deadline (a client that trickles a header or a body, or stops reading a
// response, loses its connection, not a thread for ever). Same keys and namespaces as HTTP, same
// BlockService: a block stored through either door is the same block.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "base/log.h"
#include "base/metrics.h"
#include "server/block_service.h"
#include "server/connection_threads.h"
#include "server/tenant_table.h"
#include "server/wire/wire_format.h"

namespace kvtier {

struct WireServerOptions {
  std::shared_ptr<const TenantTable> tenants;  // null or empty: no auth
  int threads = 4096;                          // connections served at once
  int max_connections_per_client = 256;        // per peer address; more are refused at once
  std::chrono::milliseconds idle_timeout{5000};     // between requests
  std::chrono::milliseconds request_timeout{30000};  // a whole request read, or a response written
  uint64_t max_body_bytes = 0;  // 0: a block document of the layout plus 16 MiB
};

class WireServer {
 public:
  WireServer(BlockService& service, WireServerOptions options);
  ~WireServer();

  // Binds and listens (port 0 picks a free one); returns the port.
  Result<int> bind(const std::string& host, int port);
  // Accepts until stop(); returns when every connection has ended.
  void run();
  // Thread-safe: no new connections; those waiting for a request are closed, a request being
  // served finishes.
  void stop();

  void visit_metrics(MetricVisitor& visitor) const;

 private:
  class Session;
  struct Metrics {
    ConnectionMetrics connections;
    Counter refused_per_client;
    Counter accept_failures;
    Counter idle_closed;
    Counter timeouts;
    Counter protocol_errors;
    Counter bytes_received;
    Counter bytes_sent;
  };
  struct OpStats {
    Histogram seconds;
    std::mutex mu;
    std::map<int, uint64_t> by_status;
  };

  void serve(int fd, const std::string& peer);
  bool admit(int fd, const std::string& peer);  // under the per-client cap
  void forget(int fd, const std::string& peer);
  void count(wire::Op op, int status, double seconds);

  BlockService& service_;
  WireServerOptions options_;
  int listen_fd_ = -1;
  std::atomic<bool> stopping_{false};
  Metrics metrics_;
  std::unique_ptr<ConnectionThreads> threads_;
  std::map<wire::Op, std::unique_ptr<OpStats>> ops_;  // fixed after construction
  std::mutex mu_;
  std::set<int> open_fds_;
  std::map<std::string, int> per_client_;
  LogThrottle refuse_log_;
  LogThrottle error_log_;
};

}  // namespace kvtier
