#include "server/http/http_routes.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "base/elapsed.h"
#include "base/metrics/metrics_exporters.h"
#include "server/http/http_api.h"
#include "server/http/http_replies.h"
#include "server/http/request_json.h"
#include "server/status_codes.h"

namespace kvtier {
namespace {

using nlohmann::json;

constexpr const char* kHashRoute = R"(/v1/blocks/([^/:]+))";
constexpr const char* kStateRoute = R"(/v1/states/([^/:]+))";
// A batchGet reply streams (chunked) and pins one slice of its blocks at a time, so its size is
// bounded by neither memory nor a byte cap; the count is bounded by the JSON request's size.
constexpr size_t kMaxBatchHashes = 65536;
constexpr uint64_t kBatchSliceBytes = 64ull << 20;
// How long a body waits for --max-body-memory to have room before it is refused: bodies in
// flight are stored within milliseconds, so a wait rides out a burst without queueing for ever.
constexpr std::chrono::seconds kBodyBudgetWait(1);

// The hashes of one batchGet and how far its reply has been written.
struct BatchGetStream {
  std::vector<BlockHash> hashes;
  std::string ns;
  size_t next = 0;
};

const Tenant* request_tenant() { return current_request() ? current_request()->tenant : nullptr; }

void send_over_budget(httplib::Response& res) {
  res.set_header("Retry-After", "1");
  send_json(res, 503, error_json("resource_exhausted", "request bodies hold all of --max-body-memory; retry"));
}

}  // namespace

RequestContext*& current_request() {
  thread_local RequestContext* context = nullptr;
  return context;
}

std::string route_of(const std::string& method, const std::string& path) {
  if (path == "/healthz") return "healthz";
  if (path == "/metrics") return "metrics";
  if (path == "/v1/stats") return "stats";
  if (path == "/v1/layout") return "layout";
  if (path == "/v1/lookup") return "lookup";
  if (path == "/v1/prefetch") return "prefetch";
  if (path == "/v1/blocks:batchGet") return "batch_get";
  if (path.rfind("/v1/blocks/", 0) == 0) {
    if (method == "PUT") return "put_block";
    if (method == "GET") return "get_block";
    if (method == "DELETE") return "delete_block";
  }
  if (path.rfind("/v1/states/", 0) == 0) {
    if (method == "PUT") return "put_state";
    if (method == "GET") return "get_state";
  }
  return "unknown";
}

HttpRoutes::HttpRoutes(BlockService& service, const HttpApiOptions& options,
                       std::function<void(MetricVisitor&)> door_metrics)
    : service_(service), options_(options), door_metrics_(std::move(door_metrics)) {}

void HttpRoutes::install(httplib::Server& s) {
  add_hooks(s);
  add_control_routes(s);
  add_prompt_routes(s);
  add_document_routes(s);
}

// --- Auth and accounting, around every route ----------------------------------------------------

bool HttpRoutes::auth_enabled() const { return options_.tenants && !options_.tenants->empty(); }

const Tenant* HttpRoutes::authenticate(const httplib::Request& req) const {
  if (!auth_enabled()) return nullptr;
  const std::string header = req.get_header_value("Authorization");
  const std::string_view prefix = "Bearer ";
  if (header.rfind(prefix, 0) != 0) return nullptr;
  return options_.tenants->authenticate(std::string_view(header).substr(prefix.size()));
}

Result<std::string> HttpRoutes::namespace_for(const std::string& requested) const {
  // The binary port checks a namespace before its tenant's rights, and so does this door.
  if (!requested.empty()) KVTIER_RETURN_IF_ERROR(check_namespace(requested));
  if (!auth_enabled()) return requested;
  return namespace_of(request_tenant(), requested);
}

std::optional<PromptRequest> HttpRoutes::prompt_request(const std::string& body, BodyBudget::Lease& lease,
                                                        httplib::Response& res) const {
  // What the body becomes, from the same budget as the body, before it is built: its tokens (the
  // parser sizes their array once, for as many as the body can hold), then its reply.
  if (!lease.grow(prompt_token_capacity(body.size()) * sizeof(uint32_t), "a prompt's tokens")) {
    send_over_budget(res);
    return std::nullopt;
  }
  auto r = parse_prompt_request(body);
  if (!r.ok() && r.status().code() == StatusCode::kResourceExhausted) {
    send_json(res, 413, error_json("payload_too_large", r.status().message()));
    return std::nullopt;
  }
  if (r.ok() && r->ns.empty() && !auth_enabled()) {
    r = invalid_argument("missing field 'namespace' (only a key with one namespace may leave it out)");
  }
  if (r.ok()) {
    if (auto ns = namespace_for(r->ns); ns.ok()) r->ns = std::move(ns).value();
    else r = ns.status();
  }
  if (!r.ok()) {
    send_error(res, r.status());
    return std::nullopt;
  }
  const uint64_t blocks = r->tokens.size() / std::max<uint32_t>(1, service_.layout().block_size) + 1;
  if (!lease.grow(blocks * kLookupReplyBytesPerBlock, "a lookup's reply")) {
    send_over_budget(res);
    return std::nullopt;
  }
  return std::move(r).value();
}

void HttpRoutes::count(const httplib::Request& req, int status) {
  std::lock_guard lock(counts_mu_);
  ++counts_[{route_of(req.method, req.path), status}];
}

Histogram* HttpRoutes::latency(const char* route) {
  return latency_.emplace(route, std::make_unique<Histogram>()).first->second.get();
}

HttpRoutes::Handler HttpRoutes::timed(const char* route, Handler handler) {
  Histogram* h = latency(route);
  return [h, handler = std::move(handler)](const httplib::Request& req, httplib::Response& res) {
    const auto t0 = std::chrono::steady_clock::now();
    handler(req, res);
    h->observe(seconds_since(t0));
  };
}

void HttpRoutes::add_hooks(httplib::Server& s) {
  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (options_.access_log && current_request()) {
      // The client's id when it sent one (bounded: it is written into every line), else ours.
      std::string id = req.get_header_value("X-Request-Id").substr(0, 128);
      if (id.empty()) id = options_.access_log->next_request_id();
      res.set_header("X-Request-Id", id);
      current_request()->request_id = std::move(id);
    }
    if (req.path == "/healthz" || !auth_enabled())
      return httplib::Server::HandlerResponse::Unhandled;
    const Tenant* t = request_tenant();
    // Refused before the body was read, so the connection closes.
    if (!t) {
      res.set_header("WWW-Authenticate", "Bearer");
      send_refusal(res, 401, "unauthenticated", "missing or wrong 'Authorization: Bearer <api key>'");
      return httplib::Server::HandlerResponse::Handled;
    }
    // Stats and metrics span every tenant's namespaces.
    if (!t->admin && (req.path == "/metrics" || req.path == "/v1/stats")) {
      send_refusal(res, 403, "permission_denied", req.path + " needs an admin key");
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 404) {
      send_json(res, 404, error_json("not_found", "no route " + req.method + " " + req.path));
    } else if (res.status == 413) {
      send_json(res, 413, error_json("payload_too_large", "the body is larger than this server accepts"));
    } else {
      send_json(res, res.status, error_json("http_error", "the request could not be served"));
    }
  });
  s.set_exception_handler([this](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
    handler_exceptions_.inc();
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_json(res, 500, error_json("internal", req.method + " " + req.path + " threw: " + what));  // logged below
  });
  // Every answer is counted by route and status; every refusal (a miss is not one) is logged with
  // the reason its JSON body gives, at most once a second plus a count of the ones folded in.
  s.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    count(req, res.status);
    if (options_.access_log) log_access(req, res);
    // A refusal before the body was read closes: the unread body is not the next request.
    if (current_request() && res.get_header_value("Connection") == "close") current_request()->close = true;
    if (res.status >= 400 && res.status != 404) {
      reject_log_.warn("{} {} -> {}: {}", req.method, req.path, res.status, res.body);
    }
  });
}

void HttpRoutes::log_access(const httplib::Request& req, const httplib::Response& res) {
  AccessLog& log = *options_.access_log;
  if (!log.sampled()) return;
  const RequestContext* c = current_request();
  AccessLine l;
  l.request_id = c && !c->request_id.empty() ? c->request_id : log.next_request_id();
  l.tenant = c && c->tenant ? &c->tenant->name : nullptr;
  l.method = req.method;
  l.route = route_of(req.method, req.path);
  l.status = res.status;
  l.bytes_in = req.has_header("Content-Length") ? req.get_header_value<uint64_t>("Content-Length")
                                                : req.body.size();
  // A streamed reply has no length up front: its provider counted what it wrote (the server logs
  // after the body is out).
  l.bytes_out = !res.body.empty()                   ? res.body.size()
                : c && c->access.streamed_bytes > 0 ? c->access.streamed_bytes
                                                    : res.content_length_;
  l.latency_seconds =
      c && c->started != std::chrono::steady_clock::time_point{} ? seconds_since(c->started) : 0;
  l.note = c ? &c->access : nullptr;
  log.write(l);
}

// --- Routes -------------------------------------------------------------------------------------

void HttpRoutes::add_control_routes(httplib::Server& s) {
  s.Get("/healthz", timed("healthz", [this](const httplib::Request&, httplib::Response& res) { healthz(res); }));
  s.Get("/metrics", timed("metrics", [this](const httplib::Request&, httplib::Response& res) { metrics(res); }));
  s.Get("/v1/stats", timed("stats", [this](const httplib::Request&, httplib::Response& res) {
          res.set_content(stats_json(), "application/json");
        }));
  s.Get("/v1/layout", timed("layout", [this](const httplib::Request&, httplib::Response& res) { layout(res); }));
}

void HttpRoutes::add_prompt_routes(httplib::Server& s) {
  post_json(s, "/v1/lookup", "lookup", [this](const std::string& body, BodyBudget::Lease& lease,
                                             httplib::Response& res) { lookup(body, lease, res); });
  post_json(s, "/v1/prefetch", "prefetch", [this](const std::string& body, BodyBudget::Lease& lease,
                                                 httplib::Response& res) { prefetch(body, lease, res); });
}

void HttpRoutes::add_document_routes(httplib::Server& s) {
  // PUT reads the body straight into the buffer the stored block will keep (no string growth,
  // no copy of the KV on the way in).
  Histogram* put_latency = latency("put_block");
  s.Put(kHashRoute, [this, put_latency](const httplib::Request& req, httplib::Response& res,
                                        const httplib::ContentReader& read) {
    const auto t0 = std::chrono::steady_clock::now();
    put_document(req, res, read, [this](const BlockHash& hash, AlignedBuffer body, size_t length, const std::string& ns) {
      return service_.put(hash, std::move(body), length, ns);
    });
    put_latency->observe(seconds_since(t0));
  });
  // Hybrid servers: a state snapshot's document, under the hash of the block it ends at.
  Histogram* put_state_latency = latency("put_state");
  s.Put(kStateRoute, [this, put_state_latency](const httplib::Request& req, httplib::Response& res,
                                               const httplib::ContentReader& read) {
    const auto t0 = std::chrono::steady_clock::now();
    put_document(req, res, read, [this](const BlockHash& hash, AlignedBuffer body, size_t length, const std::string& ns) {
      return service_.put_state(hash, body.span().first(length), ns);
    });
    put_state_latency->observe(seconds_since(t0));
  });
  s.Get(kStateRoute, timed("get_state", [this](const httplib::Request& req, httplib::Response& res) {
          get_state(req, res);
        }));
  s.Get(kHashRoute, timed("get_block", [this](const httplib::Request& req, httplib::Response& res) {
          get_block(req, res);
        }));
  s.Delete(kHashRoute, timed("delete_block", [this](const httplib::Request& req, httplib::Response& res) {
             delete_block(req, res);
           }));
  post_json(s, "/v1/blocks:batchGet", "batch_get",
            [this](const std::string& body, BodyBudget::Lease&, httplib::Response& res) { batch_get(body, res); });
}

void HttpRoutes::healthz(httplib::Response& res) const {
  json body{{"status", "ok"}};
  // Where routers subscribe (with the ports a "*" picked).
  if (const KvEventPublisher* events = service_.stack().kv_events()) {
    body["kv_events"] = {{"endpoint", events->endpoint()},
                         {"replay_endpoint", events->replay_endpoint()}};
  }
  if (binary_port_ > 0) {
    body["binary_port"] = binary_port_;
    if (binary_tls_) body["binary_tls"] = true;
  }
  send_json(res, 200, body);
}

void HttpRoutes::metrics(httplib::Response& res) const {
  PrometheusTextWriter w;
  visit_all_metrics(w);
  res.set_content(w.text(), "text/plain; version=0.0.4");
}

void HttpRoutes::layout(httplib::Response& res) const {
  const KvLayout& l = service_.layout();
  char fp[17];
  std::snprintf(fp, sizeof(fp), "%016llx", static_cast<unsigned long long>(l.fingerprint()));
  json body{{"layout", l.to_json()},
            {"fingerprint", fp},
            {"hash", hash_algorithm_name(service_.hash_algorithm())},
            {"block_bytes", l.dense_block_bytes()}};
  if (const HybridLayout* h = service_.hybrid_layout()) {
    body["hybrid_layout"] = h->to_json();
    body["hybrid_fingerprint"] = h->fingerprint_hex();  // what block hashes are made with
    body["state_bytes"] = h->snapshot_bytes();
  }
  send_json(res, 200, body);
}

void HttpRoutes::lookup(const std::string& body, BodyBudget::Lease& lease, httplib::Response& res) {
  auto r = prompt_request(body, lease, res);
  if (!r) return;
  if (RequestContext* c = current_request()) {
    c->access.ns = r->ns;
    c->access.tokens = r->tokens.size();
  }
  auto reply = service_.lookup(*r);
  if (!reply.ok()) return send_error(res, reply.status());
  if (RequestContext* c = current_request()) {
    c->access.matched_tokens = reply->matched_tokens;
    for (size_t i = 0; i < reply->blocks.size(); ++i) c->access.add_block(reply->blocks[i].tier, i);
  }
  send_json(res, 200, to_json(*reply));
}

void HttpRoutes::prefetch(const std::string& body, BodyBudget::Lease& lease, httplib::Response& res) {
  auto r = prompt_request(body, lease, res);
  if (!r) return;
  if (RequestContext* c = current_request()) {
    c->access.ns = r->ns;
    c->access.tokens = r->tokens.size();
  }
  auto reply = service_.prefetch(*r);
  if (!reply.ok()) return send_error(res, reply.status());
  if (RequestContext* c = current_request()) {
    c->access.matched_tokens = reply->matched_tokens;
    for (size_t i = 0; i < reply->tiers.size(); ++i)
      c->access.add_block(std::string(reply->tiers[i]), i);
  }
  send_json(res, 200, to_json(*reply));
}

std::optional<std::pair<BlockHash, std::string>> HttpRoutes::addressed(const httplib::Request& req,
                                                                       httplib::Response& res) const {
  auto hash = path_hash(req);
  if (!hash.ok()) {
    send_error(res, hash.status());
    return std::nullopt;
  }
  auto ns = namespace_for(req.get_param_value("namespace"));
  if (!ns.ok()) {
    send_error(res, ns.status());
    return std::nullopt;
  }
  if (RequestContext* c = current_request()) {
    c->access.ns = *ns;
    c->access.hash = hash->hex();
  }
  return std::pair{*hash, std::move(ns).value()};
}

void HttpRoutes::get_state(const httplib::Request& req, httplib::Response& res) {
  auto at = addressed(req, res);
  if (!at) return;
  const auto& [hash, ns] = *at;
  auto doc = service_.get_state(hash, ns);
  if (!doc.ok()) return send_error(res, doc.status());
  res.set_content(reinterpret_cast<const char*>(doc->data()), doc->size(), "application/octet-stream");
}

void HttpRoutes::get_block(const httplib::Request& req, httplib::Response& res) {
  auto at = addressed(req, res);
  if (!at) return;
  const auto& [hash, ns] = *at;
  auto doc = service_.get(hash, ns);
  if (!doc.ok()) return send_error(res, doc.status());
  auto body = std::make_shared<BodyPieces>();
  body->add(*doc);
  send_pieces(res, std::move(body), "application/octet-stream");
}

void HttpRoutes::delete_block(const httplib::Request& req, httplib::Response& res) {
  auto at = addressed(req, res);
  if (!at) return;
  const auto& [hash, ns] = *at;
  auto erased = service_.erase(hash, ns);
  if (!erased.ok()) return send_error(res, erased.status());
  if (!*erased) return send_error(res, not_found("block " + hash.hex() + " is not cached"));
  res.status = 204;
}

void HttpRoutes::batch_get(const std::string& req_body, httplib::Response& res) {
  auto r = parse_batch_get_request(req_body, kMaxBatchHashes);
  if (!r.ok()) return send_error(res, r.status());
  auto ns = namespace_for(r->ns);
  if (!ns.ok()) return send_error(res, ns.status());
  if (RequestContext* c = current_request()) c->access.ns = *ns;
  auto stream = std::make_shared<BatchGetStream>(BatchGetStream{std::move(r->hashes), *ns, 0});
  const size_t slice = static_cast<size_t>(
      std::max<uint64_t>(1, kBatchSliceBytes / std::max<uint64_t>(1, service_.layout().dense_block_bytes())));
  res.set_chunked_content_provider("application/x-kvtier-blocks", [this, stream, slice](size_t, httplib::DataSink& sink) {
    if (stream->next >= stream->hashes.size()) {
      sink.done();
      return true;
    }
    const size_t n = std::min(slice, stream->hashes.size() - stream->next);
    auto docs = service_.batch_get(std::span(stream->hashes).subspan(stream->next, n), stream->ns);
    stream->next += n;
    RequestContext* c = current_request();  // this thread writes the reply
    for (const auto& d : docs) {
      const uint64_t size = d ? d->size() : 0;
      std::string head(8, '\0');
      for (int i = 0; i < 8; ++i) head[i] = static_cast<char>(size >> (8 * i));
      if (d) head += d->head;
      if (!sink.write(head.data(), head.size())) return false;
      if (d && !sink.write(reinterpret_cast<const char*>(d->block->data().data()), d->block->data().size())) {
        return false;
      }
      if (c) c->access.streamed_bytes += 8 + size;
    }
    return true;
  });
}

// --- Metrics ------------------------------------------------------------------------------------

void HttpRoutes::visit_all_metrics(MetricVisitor& w) const {
  service_.stack().visit_metrics(w);
  service_.visit_metrics(w);
  door_metrics_(w);
  for (const auto& source : metric_sources_) source(w);
}

std::string HttpRoutes::stats_json() const {
  CacheStack& stack = service_.stack();
  json tiers = json::array();
  for (const auto& t : stack.cache().tiers()) {
    tiers.push_back({{"name", t->name()},
                     {"blocks", t->block_count()},
                     {"used_bytes", t->used_bytes()},
                     {"capacity_bytes", t->capacity_bytes()}});
  }
  JsonMetricsWriter w;
  visit_all_metrics(w);
  return json{{"layout", stack.layout().name},
              {"block_bytes", stack.layout().dense_block_bytes()},
              {"tiers", tiers},
              {"metrics", w.json()}}
      .dump();  // our own names and numbers only
}

void HttpRoutes::visit_metrics(MetricVisitor& v) const {
  if (options_.access_log) options_.access_log->visit_metrics(v);
  for (const auto& [route, h] : latency_) {
    v.histogram("kvtier_http_request_seconds", "Time spent in a route's handler", {{"route", route}},
                h->snapshot());
  }
  {
    std::lock_guard lock(counts_mu_);
    for (const auto& [key, n] : counts_) {
      v.counter("kvtier_http_requests_total", "Requests answered, by route and status",
                {{"route", key.first}, {"code", std::to_string(key.second)}}, n);
    }
  }
  v.counter("kvtier_http_handler_exceptions_total", "Handlers that threw (answered 500)", {},
            handler_exceptions_.value());
}

// --- Bodies -------------------------------------------------------------------------------------

void HttpRoutes::post_json(httplib::Server& s, const std::string& pattern, const char* route, JsonHandler handler) {
  add_json_post(s, pattern, latency(route), service_.body_budget(), options_.max_body_bytes, std::move(handler));
}

void HttpRoutes::put_document(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& read,
                              const DocumentStore& store) {
  // The body is only read below; every early answer closes the connection (send_refusal).
  if (!req.has_header("Content-Length")) {
    return send_refusal(res, 411, "length_required", "PUT a document with a Content-Length (no chunked bodies)");
  }
  const uint64_t length = req.get_header_value<uint64_t>("Content-Length");
  if (length > options_.max_body_bytes) {
    return send_refusal(res, 413, "payload_too_large",
                        "the body is " + std::to_string(length) + " bytes; at most " +
                            std::to_string(options_.max_body_bytes) + " are accepted");
  }
  auto hash = path_hash(req);
  if (!hash.ok()) return send_refusal(res, 400, "invalid_argument", hash.status().message());
  auto ns = namespace_for(req.get_param_value("namespace"));
  if (!ns.ok()) {
    return send_refusal(res, http_status_for(ns.status().code()), error_code_for(ns.status().code()),
                        ns.status().message());
  }
  if (RequestContext* c = current_request()) {
    c->access.ns = *ns;
    c->access.hash = hash->hex();
  }
  // The buffer is allocated for the declared length before a byte of the body is in: its bytes
  // come from the server-wide budget first.
  auto lease = service_.body_budget().take(length, std::chrono::steady_clock::now() + kBodyBudgetWait, "a PUT body");
  if (!lease) {
    res.set_header("Retry-After", "1");
    return send_refusal(res, 503, "resource_exhausted", "request bodies hold all of --max-body-memory; retry");
  }
  AlignedBuffer body(std::max<uint64_t>(length, 1), 64, /*zeroed=*/false);
  size_t got = 0;
  const bool complete = read([&](const char* data, size_t n) {
    if (n > length - got) return false;
    std::memcpy(body.data() + got, data, n);
    got += n;
    return true;
  });
  if (!complete || got != length) {
    return send_refusal(res, 400, "invalid_argument",
                        "the body ended after " + std::to_string(got) + " of " + std::to_string(length) + " bytes");
  }
  auto outcome = store(*hash, std::move(body), got, *ns);
  if (!outcome.ok()) return send_error(res, outcome.status());
  const bool stored = *outcome == InsertOutcome::kInserted;
  send_json(res, stored ? 201 : 200, {{"hash", hash->hex()}, {"stored", stored}});
}

}  // namespace kvtier
