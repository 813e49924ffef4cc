// HttpRoutes: what kvtierd's HTTP door answers — its routes, their auth (a Bearer key names a
// tenant, a tenant its namespaces), body limits within --max-body-memory, and per-route latency
// histograms and status counters. What a route does lives in BlockService; connections, TLS and
// deadlines in HttpApi.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "base/log.h"
#include "base/metrics/metrics.h"
#include "server/block_service.h"
#include "server/http/access_log.h"
#include "server/http/json_post.h"
#include "server/net/body_budget.h"
#include "server/tenant_table.h"

namespace httplib {
class ContentReader;
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace kvtier {

struct HttpApiOptions;

// What a connection's thread knows of the request it is serving. cpp-httplib hands handlers only
// the Request, and serves each request on its connection's thread from first byte to last.
struct RequestContext {
  const Tenant* tenant = nullptr;  // authenticated once, when the headers are in
  bool close = false;              // the answer said "Connection: close"
  std::chrono::steady_clock::time_point started{};  // when its first byte was there
  std::string request_id;  // X-Request-Id, given or made (with an access log)
  AccessNote access;       // what its route found, for the access log
};
// The context of the request this thread serves; HttpApi::serve sets it for a connection's life.
RequestContext*& current_request();

class HttpRoutes {
 public:
  // `options` and `door_metrics` (every counter of the door, for /metrics and /v1/stats) outlive
  // this.
  HttpRoutes(BlockService& service, const HttpApiOptions& options, std::function<void(MetricVisitor&)> door_metrics);

  // Installs the hooks and routes on `server`. Once.
  void install(httplib::Server& server);
  // The tenant of the key a request presents; nullptr when auth is off or the key is unknown.
  // Called once per request, when its headers are in; handlers read it from current_request().
  const Tenant* authenticate(const httplib::Request& req) const;

  // /healthz names the binary protocol's port, and whether it speaks TLS.
  void offer_binary_port(int port, bool tls) {
    binary_port_ = port;
    binary_tls_ = tls;
  }
  // Metrics /metrics and /v1/stats report besides the cache's, the service's and the door's.
  void add_metrics(std::function<void(MetricVisitor&)> source) { metric_sources_.push_back(std::move(source)); }
  // Latency per route, answers per route and status, handlers that threw.
  void visit_metrics(MetricVisitor& visitor) const;

 private:
  using Handler = std::function<void(const httplib::Request&, httplib::Response&)>;
  using JsonHandler = JsonPostHandler;
  // A PUT of one document (a block, a state snapshot): `store(hash in the path, buffer, length,
  // namespace)`.
  using DocumentStore =
      std::function<Result<InsertOutcome>(const BlockHash&, AlignedBuffer, size_t, const std::string&)>;

  // The steps of install().
  void add_hooks(httplib::Server& s);
  void add_control_routes(httplib::Server& s);
  void add_prompt_routes(httplib::Server& s);
  void add_document_routes(httplib::Server& s);

  // The request's line in the access log, if it has one and this request is sampled.
  void log_access(const httplib::Request& req, const httplib::Response& res);

  // Handlers.
  void healthz(httplib::Response& res) const;
  void metrics(httplib::Response& res) const;
  void layout(httplib::Response& res) const;
  void lookup(const std::string& body, BodyBudget::Lease& lease, httplib::Response& res);
  void prefetch(const std::string& body, BodyBudget::Lease& lease, httplib::Response& res);
  void get_block(const httplib::Request& req, httplib::Response& res);
  void get_state(const httplib::Request& req, httplib::Response& res);
  void delete_block(const httplib::Request& req, httplib::Response& res);
  // Per requested hash, in order, an 8-byte little-endian length and that many bytes of block
  // document; length 0 is a miss (a document is never empty).
  void batch_get(const std::string& body, httplib::Response& res);

  Handler timed(const char* route, Handler handler);
  Histogram* latency(const char* route);
  // A JSON POST route (json_post.h), timed as `route`.
  void post_json(httplib::Server& s, const std::string& pattern, const char* route, JsonHandler handler);
  // The body read into the buffer `store` keeps, within --max-body-memory, then stored.
  void put_document(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& read,
                    const DocumentStore& store);
  // The block a route's path names and the namespace the request may act in; otherwise the
  // refusal is sent and nullopt returned.
  std::optional<std::pair<BlockHash, std::string>> addressed(const httplib::Request& req, httplib::Response& res) const;
  bool auth_enabled() const;
  // The namespace a request may act in: `requested` (or the tenant's only namespace when it names
  // none) if the tenant may use it; kPermissionDenied otherwise. Without auth, `requested`.
  Result<std::string> namespace_for(const std::string& requested) const;
  // The body as a prompt request, its namespace checked (and filled in) by namespace_for and its
  // tokens' memory taken from `lease`; otherwise the refusal is sent on `res` and nullopt returned.
  std::optional<PromptRequest> prompt_request(const std::string& body, BodyBudget::Lease& lease,
                                              httplib::Response& res) const;
  void count(const httplib::Request& req, int status);
  void visit_all_metrics(MetricVisitor& visitor) const;
  std::string stats_json() const;

  BlockService& service_;
  const HttpApiOptions& options_;
  std::function<void(MetricVisitor&)> door_metrics_;
  int binary_port_ = 0;  // 0: none offered
  bool binary_tls_ = false;
  std::vector<std::function<void(MetricVisitor&)>> metric_sources_;
  std::map<std::string, std::unique_ptr<Histogram>> latency_;  // by route, fixed after install
  mutable std::mutex counts_mu_;
  std::map<std::pair<std::string, int>, uint64_t> counts_;  // (route, status) -> requests
  Counter handler_exceptions_;
  LogThrottle reject_log_;
};

// The route a request names, for metrics ("lookup", "put_block", ..., "unknown").
std::string route_of(const std::string& method, const std::string& path);

}  // namespace kvtier
