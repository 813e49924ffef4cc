// HttpApi: kvtierd's HTTP face: cpp-httplib's parser and router on kvtierd's own accept loop
// (ConnectionListener: per-client connection caps, idle and per-request deadlines, TLS). JSON for
// control, raw block documents for data. The routes, their auth and body limits are HttpRoutes';
// what a route does lives in BlockService.
#pragma once

#include <atomic>
#include <map>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "base/metrics/metrics.h"
#include "server/block_service.h"
#include "server/net/body_budget.h"
#include "server/http/http_routes.h"
#include "server/net/connection_listener.h"
#include "server/tenant_table.h"

namespace httplib {
class ContentReader;
struct Request;
struct Response;
}  // namespace httplib

namespace kvtier {

class TlsContext;

struct HttpApiOptions {
  // Who may do what (--api-key, --api-keys); null or empty: no auth, every namespace open.
  std::shared_ptr<const TenantTable> tenants;
  int threads = 4096;  // connections served at once, a thread each (started on demand)
  uint64_t max_body_bytes = 0;  // 0: a block document of the layout plus 16 MiB
  // PEM files; both set: HTTPS only (the same routes, over OpenSSL).
  std::string tls_cert;
  std::string tls_key;
  // A connection that sends no request for this long is closed (it holds a thread until then).
  int idle_timeout_s = 5;
  int max_connections_per_client = 256;  // per peer address; more are refused with a 503
  // A request (TLS handshake, headers and body) must arrive within this many seconds of its first
  // byte, and each write of a reply must make progress within it.
  int request_timeout_s = 30;
  // --access-log: a line per request; null: none.
  std::shared_ptr<AccessLog> access_log;
};

class HttpApi {
 public:
  // Check ok() before bind(): a TLS certificate or key that cannot be loaded leaves no server.
  HttpApi(BlockService& service, HttpApiOptions options);
  ~HttpApi();
  Status status() const { return status_; }

  // Binds the socket (port 0 picks a free one); returns the port.
  Result<int> bind(const std::string& host, int port);
  // Serves until stop(); requests being handled finish before it returns, and connections
  // waiting for their next request are closed. False when it could not serve (never bound).
  bool run();
  // Thread-safe; async-signal-unsafe (call it from a normal thread).
  void stop();

  void visit_metrics(MetricVisitor& visitor) const;

  // Before run(): /healthz tells clients the binary protocol's port, and /metrics and /v1/stats
  // also report `source` (the binary server's counters).
  // `/healthz` names the binary port, and whether it speaks TLS (it does exactly when HTTPS is on).
  void offer_binary_port(int port, bool tls) { routes_.offer_binary_port(port, tls); }
  void add_metrics(std::function<void(MetricVisitor&)> source) { routes_.add_metrics(std::move(source)); }

  // One connection, from accept (and TLS handshake) to close, on the calling thread; the caller
  // closes `fd`. run() calls it for every connection it accepts; the fuzz target calls it on one
  // end of a socket pair.
  void serve(int fd);

 private:
  class RequestServer;

  BlockService& service_;
  HttpApiOptions options_;
  Status status_;
  std::unique_ptr<TlsContext> tls_;  // null: plain HTTP
  std::unique_ptr<RequestServer> server_;
  ConnectionListener listener_;
  HttpRoutes routes_{service_, options_, [this](MetricVisitor& v) { visit_metrics(v); }};
  Counter idle_closed_;
  Counter timeouts_;
  Counter tls_failures_;
  LogThrottle connection_log_;
};

}  // namespace kvtier
