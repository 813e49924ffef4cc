#include "server/http/http_api.h"

#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include <httplib.h>

#include "base/metrics/metrics_exporters.h"
#include "serialize/format/block_codec.h"
#include "serialize/format/block_document.h"
#include "server/http/request_json.h"
#include "server/net/connection_stream.h"
#include "server/net/tls_context.h"
#include "server/status_codes.h"
#include "base/net/socket_io.h"

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

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(json_text(body), "application/json");
}

void send_error(httplib::Response& res, const Status& st) {
  send_json(res, http_status_for(st.code()), error_json(error_code_for(st.code()), st.message()));
}

// A response body made of pieces written one after another: small strings it owns and the KV
// bytes of blocks it keeps alive. Blocks go to the socket from where the tier holds them, never
// copied into a body first (a block is megabytes).
class BodyPieces {
 public:
  void add(std::string text) {
    texts_.push_back(std::make_unique<std::string>(std::move(text)));
    add_span(texts_.back()->data(), texts_.back()->size());
  }
  void add(const BlockDocumentParts& doc) {
    add(doc.head);
    blocks_.push_back(doc.block);
    add_span(reinterpret_cast<const char*>(doc.block->data().data()), doc.block->data().size());
  }
  uint64_t size() const { return ends_.empty() ? 0 : ends_.back(); }
  // Writes from `offset` to the end of the piece holding it; the sink calls again for the rest.
  bool write_from(uint64_t offset, httplib::DataSink& sink) const {
    const size_t i = std::upper_bound(ends_.begin(), ends_.end(), offset) - ends_.begin();
    const uint64_t start = ends_[i] - pieces_[i].second;
    return sink.write(pieces_[i].first + (offset - start), ends_[i] - offset);
  }

 private:
  void add_span(const char* p, size_t n) {
    if (n == 0) return;
    pieces_.emplace_back(p, n);
    ends_.push_back(size() + n);
  }
  std::vector<std::unique_ptr<std::string>> texts_;  // stable addresses as the vector grows
  std::vector<BlockRef> blocks_;
  std::vector<std::pair<const char*, size_t>> pieces_;
  std::vector<uint64_t> ends_;  // cumulative end offset of each piece
};

void send_pieces(httplib::Response& res, std::shared_ptr<const BodyPieces> body, const char* type) {
  res.set_content_provider(body->size(), type, [body](size_t offset, size_t, httplib::DataSink& sink) {
    return body->write_from(offset, sink);
  });
}

Result<BlockHash> path_hash(const httplib::Request& req) {
  auto h = BlockHash::from_hex(req.matches[1].str());
  if (!h.ok()) return invalid_argument("the path's block hash: " + h.status().message());
  return *h;
}


}  // namespace

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

namespace {

// What a connection's thread knows of the request it is serving. cpp-httplib hands handlers only
// the Request, and serves each request on its connection's thread from first byte to last.
struct RequestContext {
  const Tenant* tenant = nullptr;  // authenticated once, when the headers are in
  bool close = false;              // the answer said "Connection: close"
};
thread_local RequestContext* t_request = nullptr;

const Tenant* request_tenant() { return t_request ? t_request->tenant : nullptr; }

}  // namespace

// cpp-httplib's Server as a request parser and router only: kvtierd accepts the connections and
// hands each request to process_request (protected, hence this class) on its own stream.
class HttpApi::RequestServer final : public httplib::Server {
 public:
  // cpp-httplib takes a server without a listening socket for one shutting down, and then writes
  // no body from a content provider. It never touches this value while it is not listening
  // itself (its stop() and accept loop are never called).
  RequestServer() { svr_sock_ = 0; }
  ~RequestServer() override { svr_sock_ = INVALID_SOCKET; }  // nothing of ours for it to close

  bool serve_one(httplib::Stream& stream, bool& connection_closed,
                 const std::function<void(httplib::Request&)>& setup) {
    return process_request(stream, /*close_connection=*/false, connection_closed, setup);
  }
};

HttpApi::HttpApi(BlockService& service, HttpApiOptions options)
    : service_(service),
      options_(std::move(options)),
      server_(std::make_unique<RequestServer>()),
      listener_(options_.tls_cert.empty() ? "http" : "https", options_.threads, options_.max_connections_per_client) {
  if (options_.max_body_bytes == 0) {
    options_.max_body_bytes = service_.default_max_body_bytes();
  }
  if (!options_.tls_cert.empty() || !options_.tls_key.empty()) {
    auto tls = TlsContext::load(options_.tls_cert, options_.tls_key);
    if (tls.ok()) {
      tls_ = std::move(*tls);
    } else {
      status_ = tls.status();
    }
  }
  server_->set_payload_max_length(options_.max_body_bytes);
  // Only what the Keep-Alive header tells clients: the wait itself is serve()'s.
  server_->set_keep_alive_max_count(100000);
  server_->set_keep_alive_timeout(options_.idle_timeout_s);
  add_routes();
}

HttpApi::~HttpApi() = default;

const Tenant* HttpApi::authenticate(const httplib::Request& req) const {
  if (!auth_enabled()) return nullptr;
  const std::string header = req.get_header_value("Authorization");
  const std::string_view prefix = "Bearer ";
  if (header.rfind(prefix, 0) != 0) return nullptr;
  return options_.tenants->authenticate(std::string_view(header).substr(prefix.size()));
}

Result<std::string> HttpApi::namespace_for(const std::string& requested) const {
  // The binary port checks a namespace before its tenant's rights, and so does this door.
  if (!requested.empty()) KVTIER_RETURN_IF_ERROR(check_namespace(requested));
  if (!auth_enabled()) return requested;
  return namespace_of(request_tenant(), requested);
}

std::optional<PromptRequest> HttpApi::prompt_request(const std::string& body, BodyBudget::Lease& lease,
                                                     httplib::Response& res) const {
  auto over_budget = [&] {
    res.set_header("Retry-After", "1");
    send_json(res, 503, error_json("resource_exhausted", "request bodies hold all of --max-body-memory; retry"));
    return std::nullopt;
  };
  // What the body becomes, from the same budget as the body, before it is built: its tokens (the
  // parser sizes their array once, for as many as the body can hold), then its reply.
  if (!lease.grow(prompt_token_capacity(body.size()) * sizeof(uint32_t), "a prompt's tokens")) return over_budget();
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
  if (!lease.grow(blocks * kLookupReplyBytesPerBlock, "a lookup's reply")) return over_budget();
  return std::move(r).value();
}

void HttpApi::count(const httplib::Request& req, int status) {
  std::lock_guard lock(counts_mu_);
  ++counts_[{route_of(req.method, req.path), status}];
}

HttpApi::Handler HttpApi::timed(const char* route, Handler handler) {
  Histogram* h = latency_.emplace(route, std::make_unique<Histogram>()).first->second.get();
  return [h, handler = std::move(handler)](const httplib::Request& req, httplib::Response& res) {
    const auto t0 = std::chrono::steady_clock::now();
    handler(req, res);
    h->observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  };
}

void HttpApi::add_routes() {
  httplib::Server& s = *server_;
  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (req.path == "/healthz" || !auth_enabled()) return httplib::Server::HandlerResponse::Unhandled;
    const Tenant* t = request_tenant();
    // Refused before the body was read: the connection must close, or the unread body would be
    // parsed as the next request.
    if (!t) {
      res.set_header("WWW-Authenticate", "Bearer");
      res.set_header("Connection", "close");
      send_json(res, 401, error_json("unauthenticated", "missing or wrong 'Authorization: Bearer <api key>'"));
      return httplib::Server::HandlerResponse::Handled;
    }
    // Stats and metrics span every tenant's namespaces.
    if (!t->admin && (req.path == "/metrics" || req.path == "/v1/stats")) {
      res.set_header("Connection", "close");
      send_json(res, 403, error_json("permission_denied", req.path + " needs an admin key"));
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
    // A refusal before the body was read closes: the unread body is not the next request.
    if (t_request && res.get_header_value("Connection") == "close") t_request->close = true;
    if (res.status >= 400 && res.status != 404) {
      if (auto n = reject_log_.admit()) {
        spdlog::warn("{} {} -> {}: {} ({} similar suppressed)", req.method, req.path, res.status, res.body, *n);
      }
    }
  });

  s.Get("/healthz", timed("healthz", [this](const httplib::Request&, httplib::Response& res) {
          json body{{"status", "ok"}};
          if (binary_port_ > 0) {
            body["binary_port"] = binary_port_;
            if (binary_tls_) body["binary_tls"] = true;
          }
          send_json(res, 200, body);
        }));
  s.Get("/metrics", timed("metrics", [this](const httplib::Request&, httplib::Response& res) {
          PrometheusTextWriter w;
          service_.stack().cache().visit_metrics(w);
          service_.visit_metrics(w);
          visit_metrics(w);
          for (const auto& source : metric_sources_) source(w);
          res.set_content(w.text(), "text/plain; version=0.0.4");
        }));
  s.Get("/v1/stats", timed("stats", [this](const httplib::Request&, httplib::Response& res) {
          res.set_content(stats_json(), "application/json");
        }));
  s.Get("/v1/layout", timed("layout", [this](const httplib::Request&, httplib::Response& res) {
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
        }));
  post_json("/v1/lookup", "lookup", [this](const httplib::Request&, const std::string& body, BodyBudget::Lease& lease,
                                            httplib::Response& res) {
    auto r = prompt_request(body, lease, res);
    if (!r) return;
    auto reply = service_.lookup(*r);
    if (!reply.ok()) return send_error(res, reply.status());
    send_json(res, 200, to_json(*reply));
  });
  post_json("/v1/prefetch", "prefetch", [this](const httplib::Request&, const std::string& body,
                                               BodyBudget::Lease& lease, httplib::Response& res) {
    auto r = prompt_request(body, lease, res);
    if (!r) return;
    auto reply = service_.prefetch(*r);
    if (!reply.ok()) return send_error(res, reply.status());
    send_json(res, 200, to_json(*reply));
  });
  // PUT reads the body straight into the buffer the stored block will keep (no string growth,
  // no copy of the KV on the way in).
  Histogram* put_latency = latency_.emplace("put_block", std::make_unique<Histogram>()).first->second.get();
  s.Put(kHashRoute, [this, put_latency](const httplib::Request& req, httplib::Response& res,
                                        const httplib::ContentReader& read) {
    const auto t0 = std::chrono::steady_clock::now();
    put_document(req, res, read, [this](const BlockHash& hash, AlignedBuffer body, size_t length, const std::string& ns) {
      return service_.put(hash, std::move(body), length, ns);
    });
    put_latency->observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  });
  // Hybrid servers: a state snapshot's document, under the hash of the block it ends at.
  Histogram* put_state_latency = latency_.emplace("put_state", std::make_unique<Histogram>()).first->second.get();
  s.Put(kStateRoute, [this, put_state_latency](const httplib::Request& req, httplib::Response& res,
                                               const httplib::ContentReader& read) {
    const auto t0 = std::chrono::steady_clock::now();
    put_document(req, res, read, [this](const BlockHash& hash, AlignedBuffer body, size_t length, const std::string& ns) {
      return service_.put_state(hash, body.span().first(length), ns);
    });
    put_state_latency->observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  });
  s.Get(kStateRoute, timed("get_state", [this](const httplib::Request& req, httplib::Response& res) {
          auto hash = path_hash(req);
          if (!hash.ok()) return send_error(res, hash.status());
          auto ns = namespace_for(req.get_param_value("namespace"));
          if (!ns.ok()) return send_error(res, ns.status());
          auto doc = service_.get_state(*hash, *ns);
          if (!doc.ok()) return send_error(res, doc.status());
          res.set_content(reinterpret_cast<const char*>(doc->data()), doc->size(), "application/octet-stream");
        }));
  s.Get(kHashRoute, timed("get_block", [this](const httplib::Request& req, httplib::Response& res) {
          auto hash = path_hash(req);
          if (!hash.ok()) return send_error(res, hash.status());
          auto ns = namespace_for(req.get_param_value("namespace"));
          if (!ns.ok()) return send_error(res, ns.status());
          auto doc = service_.get(*hash, *ns);
          if (!doc.ok()) return send_error(res, doc.status());
          auto body = std::make_shared<BodyPieces>();
          body->add(*doc);
          send_pieces(res, std::move(body), "application/octet-stream");
        }));
  s.Delete(kHashRoute, timed("delete_block", [this](const httplib::Request& req, httplib::Response& res) {
             auto hash = path_hash(req);
             if (!hash.ok()) return send_error(res, hash.status());
             auto ns = namespace_for(req.get_param_value("namespace"));
             if (!ns.ok()) return send_error(res, ns.status());
             auto erased = service_.erase(*hash, *ns);
             if (!erased.ok()) return send_error(res, erased.status());
             if (!*erased) return send_error(res, not_found("block " + hash->hex() + " is not cached"));
             res.status = 204;
           }));
  // Response: per requested hash, in order, an 8-byte little-endian length and that many bytes
  // of block document; length 0 is a miss (a document is never empty).
  post_json("/v1/blocks:batchGet", "batch_get", [this](const httplib::Request&, const std::string& req_body,
                                                        BodyBudget::Lease&, httplib::Response& res) {
           auto r = parse_batch_get_request(req_body, kMaxBatchHashes);
           if (!r.ok()) return send_error(res, r.status());
           auto ns = namespace_for(r->ns);
           if (!ns.ok()) return send_error(res, ns.status());
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
             for (const auto& d : docs) {
               const uint64_t size = d ? d->size() : 0;
               std::string head(8, '\0');
               for (int i = 0; i < 8; ++i) head[i] = static_cast<char>(size >> (8 * i));
               if (d) head += d->head;
               if (!sink.write(head.data(), head.size())) return false;
               if (d && !sink.write(reinterpret_cast<const char*>(d->block->data().data()), d->block->data().size())) {
                 return false;
               }
             }
             return true;
           });
         });
}

void HttpApi::post_json(const std::string& pattern, const char* route, JsonHandler handler) {
  Histogram* h = latency_.emplace(route, std::make_unique<Histogram>()).first->second.get();
  BodyBudget& budget = service_.body_budget();
  const uint64_t max_body = options_.max_body_bytes;
  server_->Post(pattern, [h, &budget, max_body, handler = std::move(handler)](
                             const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& read) {
    const auto t0 = std::chrono::steady_clock::now();
    // Every early answer closes the connection: the body's unread bytes would be taken for the
    // next request.
    auto refuse = [&](int status, const char* code, const std::string& message) {
      res.set_header("Connection", "close");
      send_json(res, status, error_json(code, message));
    };
    auto too_large = [&](const std::string& length) {
      refuse(413, "payload_too_large",
             "the body is " + length + " bytes; at most " + std::to_string(max_body) + " are accepted");
    };
    if (req.is_multipart_form_data()) {
      return refuse(415, "unsupported_media_type", "send the request as a JSON body (Content-Type: application/json)");
    }
    // Refused from the header, before a byte of the body is read.
    const uint64_t declared = req.has_header("Content-Length") ? req.get_header_value<uint64_t>("Content-Length") : 0;
    if (declared > max_body) return too_large(req.get_header_value("Content-Length"));
    std::string body;
    BodyBudget::Lease lease = budget.empty();
    bool over_budget = !lease.grow(declared, "a JSON body"), over_limit = false;
    if (!over_budget) body.reserve(declared);  // one buffer of the leased size, not doublings past it
    if (!over_budget) {
      read([&](const char* data, size_t n) {
        over_limit = body.size() + n > max_body;  // a chunked body declares no length
        over_budget = !over_limit && body.size() + n > lease.bytes() && !lease.grow(n, "a JSON body");
        if (over_limit || over_budget) return false;
        body.append(data, n);
        return true;
      });
    }
    if (over_limit) return too_large("more than " + std::to_string(max_body));
    if (over_budget) {
      res.set_header("Retry-After", "1");
      return refuse(503, "resource_exhausted", "request bodies hold all of --max-body-memory; retry");
    }
    handler(req, body, lease, res);
    h->observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  });
}

void HttpApi::put_document(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& read,
                           const DocumentStore& store) {
  // The body is only read below; on every early answer the connection must close, or its unread
  // bytes would be taken for the next request.
  auto refuse = [&](int status, const char* code, const std::string& message) {
    res.set_header("Connection", "close");
    send_json(res, status, error_json(code, message));
  };
  if (!req.has_header("Content-Length")) {
    return refuse(411, "length_required", "PUT a document with a Content-Length (no chunked bodies)");
  }
  const uint64_t length = req.get_header_value<uint64_t>("Content-Length");
  if (length > options_.max_body_bytes) {
    return refuse(413, "payload_too_large", "the body is " + std::to_string(length) + " bytes; at most " +
                                                std::to_string(options_.max_body_bytes) + " are accepted");
  }
  auto hash = path_hash(req);
  if (!hash.ok()) return refuse(400, "invalid_argument", hash.status().message());
  auto ns = namespace_for(req.get_param_value("namespace"));
  if (!ns.ok()) return refuse(http_status_for(ns.status().code()), error_code_for(ns.status().code()), ns.status().message());
  // The buffer is allocated for the declared length before a byte of the body is in: its bytes
  // come from the server-wide budget first.
  auto lease = service_.body_budget().take(length, std::chrono::steady_clock::now() + kBodyBudgetWait, "a PUT body");
  if (!lease) {
    res.set_header("Retry-After", "1");
    return refuse(503, "resource_exhausted", "request bodies hold all of --max-body-memory; retry");
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
    return refuse(400, "invalid_argument", "the body ended after " + std::to_string(got) + " of " +
                                               std::to_string(length) + " bytes");
  }
  auto outcome = store(*hash, std::move(body), got, *ns);
  if (!outcome.ok()) return send_error(res, outcome.status());
  const bool stored = *outcome == InsertOutcome::kInserted;
  send_json(res, stored ? 201 : 200, {{"hash", hash->hex()}, {"stored", stored}});
}

Result<int> HttpApi::bind(const std::string& host, int port) { return listener_.bind(host, port); }

bool HttpApi::run() {
  const Status st = listener_.run([this](int fd, const std::string&) { serve(fd); },
                                  [this](int fd, const std::string& message) {
                                    const std::string body = json_text(error_json("resource_exhausted", message));
                                    const std::string text = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                                                             "Content-Length: " + std::to_string(body.size()) +
                                                             "\r\nConnection: close\r\n\r\n" + body;
                                    // Over TLS the client reads a failed handshake, not this.
                                    if (tls_) return;
                                    iovec piece{const_cast<char*>(text.data()), text.size()};
                                    (void)net::send_all(fd, std::span(&piece, 1),
                                                         std::chrono::steady_clock::now() + std::chrono::milliseconds(100));
                                  });
  if (!st.ok()) spdlog::error("{}", st.message());
  return st.ok();
}

void HttpApi::serve(int fd) {
  using Clock = std::chrono::steady_clock;
  const std::chrono::seconds request_timeout(options_.request_timeout_s);
  SSL* ssl = nullptr;
  if (tls_ && !(ssl = tls_->new_session(fd))) {
    tls_failures_.inc();
    if (auto n = connection_log_.admit()) spdlog::error("https: no TLS session for a connection: {} ({} similar suppressed)", tls_error_text("out of memory"), *n);
    return;
  }
  ConnectionStream conn(fd, ssl, request_timeout);
  if (Status st = conn.handshake(Clock::now() + request_timeout); !st.ok()) {
    tls_failures_.inc();
    if (auto n = connection_log_.admit()) spdlog::warn("https: {} ({} similar suppressed)", st.message(), *n);
    return;
  }
  RequestContext context;
  t_request = &context;
  while (!listener_.stopping()) {
    if (!conn.wait_request(std::chrono::seconds(options_.idle_timeout_s))) {
      idle_closed_.inc();
      break;
    }
    // A request that began before a shutdown is served to its end (its body may still be on the
    // way); one that arrives after it is not read at all.
    if (!listener_.begin_request(fd)) break;
    conn.begin_request(Clock::now() + request_timeout);
    context = RequestContext{};
    bool closed = false;
    const bool served = server_->serve_one(conn, closed, [this, &context](httplib::Request& req) {
      context.tenant = authenticate(req);
    });
    listener_.end_request(fd);
    if (conn.timed_out()) {
      timeouts_.inc();
      if (auto n = connection_log_.admit()) {
        spdlog::warn("http: closed a connection whose request did not arrive, or whose reply was not read, within "
                     "--request-timeout ({} similar suppressed)", *n);
      }
      break;
    }
    if (context.close) {
      conn.linger();
      break;
    }
    if (!served || closed) break;
  }
  t_request = nullptr;
}

void HttpApi::stop() { listener_.stop(); }

}  // namespace kvtier
