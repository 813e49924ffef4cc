// HttpApi: kvtierd's HTTP face: cpp-httplib's parser and routes on kvtierd's own accept loop
// (ConnectionListener: per-client connection caps, idle and per-request deadlines, TLS). JSON for
// control, raw block documents for data; every error is a JSON body {"error": {"code",
// "message"}} with a status that says whose fault it is. Auth (Bearer key, compared in constant
// time), body limits, per-route latency histograms and status counters live here; what a route
// does lives in BlockService.
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
  void offer_binary_port(int port, bool tls) {
    binary_port_ = port;
    binary_tls_ = tls;
  }
  void add_metrics(std::function<void(MetricVisitor&)> source) { metric_sources_.push_back(std::move(source)); }

  // One connection, from accept (and TLS handshake) to close, on the calling thread; the caller
  // closes `fd`. run() calls it for every connection it accepts; the fuzz target calls it on one
  // end of a socket pair.
  void serve(int fd);

 private:
  class RequestServer;
  using Handler = std::function<void(const httplib::Request&, httplib::Response&)>;
  void add_routes();
  Handler timed(const char* route, Handler handler);
  // A POST route whose body is JSON, read whatever Content-Type the client sent: `curl -d` says
  // form-urlencoded, and Debian's cpp-httplib would cap such a body at 8 KiB (a 413).
  // `lease` holds the body's bytes; a handler grows it by what the body expands to before it
  // builds that (a prompt's tokens and its reply).
  using JsonHandler = std::function<void(const httplib::Request&, const std::string& body, BodyBudget::Lease& lease,
                                         httplib::Response&)>;
  void post_json(const std::string& pattern, const char* route, JsonHandler handler);
  // A PUT of one document (a block, a state snapshot): the body read into the buffer `store` keeps,
  // within --max-body-memory, then `store(hash in the path, buffer, length, namespace)`.
  using DocumentStore = std::function<Result<InsertOutcome>(const BlockHash&, AlignedBuffer, size_t, const std::string&)>;
  void put_document(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& read,
                    const DocumentStore& store);
  // The tenant of the key a request presents; nullptr when auth is off or the key is unknown.
  // Called once per request (when its headers are in); handlers read the answer back from the
  // request being served with request_tenant().
  const Tenant* authenticate(const httplib::Request& req) const;
  bool auth_enabled() const { return options_.tenants && !options_.tenants->empty(); }
  // The namespace a request may act in: `requested` (or the tenant's only namespace when it names
  // none) if the tenant may use it; kPermissionDenied otherwise. Without auth, `requested`.
  Result<std::string> namespace_for(const std::string& requested) const;
  // The body as a prompt request, its namespace checked (and filled in) by namespace_for and its
  // tokens' memory taken from `lease`; otherwise the refusal is sent on `res` and nullopt returned.
  std::optional<PromptRequest> prompt_request(const std::string& body, BodyBudget::Lease& lease,
                                              httplib::Response& res) const;
  void count(const httplib::Request& req, int status);
  std::string stats_json();

  BlockService& service_;
  HttpApiOptions options_;
  Status status_;
  std::unique_ptr<TlsContext> tls_;  // null: plain HTTP
  std::unique_ptr<RequestServer> server_;
  ConnectionListener listener_;
  int binary_port_ = 0;  // 0: none offered
  bool binary_tls_ = false;
  std::vector<std::function<void(MetricVisitor&)>> metric_sources_;
  std::map<std::string, std::unique_ptr<Histogram>> latency_;  // by route, fixed after add_routes
  mutable std::mutex counts_mu_;
  std::map<std::pair<std::string, int>, uint64_t> counts_;  // (route, status) -> requests
  Counter handler_exceptions_;
  Counter idle_closed_;
  Counter timeouts_;
  Counter tls_failures_;
  LogThrottle reject_log_;
  LogThrottle connection_log_;
};

// The route a request names, for metrics ("lookup", "put_block", ..., "unknown").
std::string route_of(const std::string& method, const std::string& path);

}  // namespace kvtier
