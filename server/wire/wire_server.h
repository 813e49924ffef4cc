// WireServer: kvtierd's binary data plane (wire_format.h) on its own port, in the clear or inside
// TLS (with --tls-cert: the same frames, the same certificate as HTTPS). On the same accept
// loop as HTTP (ConnectionListener: per-client connection caps, a thread per connection), it
// closes a connection that sends nothing for --idle-timeout and bounds every request by a
// deadline (a client that trickles a header or a body, or stops reading a response, loses its
// connection, not a thread for ever). Same keys and namespaces as HTTP, same
// BlockService: a block stored through either door is the same block.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "base/log.h"
#include "base/metrics/metrics.h"
#include "server/block_service.h"
#include "server/net/connection_listener.h"
#include "server/tenant_table.h"
#include "server/wire/wire_format.h"

namespace kvtier {

class TlsContext;

struct WireServerOptions {
  std::shared_ptr<const TenantTable> tenants;  // null or empty: no auth
  int threads = 4096;                          // connections served at once
  int max_connections_per_client = 256;        // per peer address; more are refused at once
  std::chrono::milliseconds idle_timeout{5000};     // between requests
  std::chrono::milliseconds request_timeout{30000};  // a whole request read, or a response written
  uint64_t max_body_bytes = 0;  // 0: a block document of the layout plus 16 MiB
  // Set: every connection is TLS (the same certificate as HTTPS), the frames inside it.
  std::shared_ptr<const TlsContext> tls;
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
  // One connection, from its first request to its end, on the calling thread; the caller closes
  // `fd`. run() calls it for every connection it accepts; the fuzz target on a socket pair.
  void serve(int fd);

 private:
  class Session;
  struct Metrics {
    Counter idle_closed;
    Counter timeouts;
    Counter protocol_errors;
    Counter tls_handshake_failures;
    Counter bytes_received;
    Counter bytes_sent;
  };
  struct OpStats {
    Histogram seconds;
    std::mutex mu;
    std::map<int, uint64_t> by_status;
  };

  void count(wire::Op op, int status);  // a request answered

  BlockService& service_;
  WireServerOptions options_;
  ConnectionListener listener_;
  Metrics metrics_;
  std::map<wire::Op, std::unique_ptr<OpStats>> ops_;  // fixed after construction
  LogThrottle refuse_log_;
  LogThrottle error_log_;
};

}  // namespace kvtier
