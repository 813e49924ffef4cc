#include "server/http/http_api.h"

#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include <httplib.h>

#include "base/net/socket_io.h"
#include "server/http/request_json.h"
#include "server/net/connection_stream.h"
#include "server/net/tls_context.h"

namespace kvtier {

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
  routes_.install(*server_);
}

HttpApi::~HttpApi() = default;

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
    connection_log_.error("https: no TLS session for a connection: {}",
                          tls_error_text("out of memory"));
    return;
  }
  ConnectionStream conn(fd, ssl, request_timeout);
  if (Status st = conn.handshake(Clock::now() + request_timeout); !st.ok()) {
    tls_failures_.inc();
    connection_log_.warn("https: {}", st.message());
    return;
  }
  RequestContext context;
  current_request() = &context;
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
    context.started = Clock::now();
    bool closed = false;
    const bool served = server_->serve_one(conn, closed, [this, &context](httplib::Request& req) {
      context.tenant = routes_.authenticate(req);
    });
    listener_.end_request(fd);
    if (conn.timed_out()) {
      timeouts_.inc();
      connection_log_.warn(
          "http: closed a connection whose request did not arrive, or whose reply was not read, "
          "within "
          "--request-timeout");
      break;
    }
    if (context.close) {
      conn.linger();
      break;
    }
    if (!served || closed) break;
  }
  current_request() = nullptr;
}

void HttpApi::stop() { listener_.stop(); }

void HttpApi::visit_metrics(MetricVisitor& v) const {
  routes_.visit_metrics(v);
  const ListenerMetrics& l = listener_.metrics();
  v.counter("kvtier_http_connections_total", "Connections accepted", {}, l.connections.accepted.value());
  v.gauge("kvtier_http_connections_open", "Connections being served (one thread each)", {},
          static_cast<double>(l.connections.open.value()));
  v.gauge("kvtier_http_connections_waiting", "Connections waiting for a thread (--threads reached)", {},
          static_cast<double>(l.connections.waiting.value()));
  v.counter("kvtier_http_connections_waited_total", "Connections that found --threads busy and waited", {},
            l.connections.waited.value());
  v.counter("kvtier_http_thread_failures_total", "Connections the OS gave no thread (served by a running one)",
            {}, l.connections.thread_failures.value());
  v.counter("kvtier_http_connections_refused_total", "Connections refused: the client address had its cap open",
            {{"reason", "per_client_cap"}}, l.refused_per_client.value());
  v.counter("kvtier_http_accept_failures_total", "accept() failures other than interruptions (out of descriptors or memory)",
            {}, l.accept_failures.value());
  v.counter("kvtier_http_idle_closed_total", "Connections closed after --idle-timeout without a request", {},
            idle_closed_.value());
  v.counter("kvtier_http_timeouts_total", "Connections closed: a request or a reply's write outlasted --request-timeout",
            {}, timeouts_.value());
  v.counter("kvtier_http_tls_handshake_failures_total", "TLS connections whose handshake failed or timed out", {},
            tls_failures_.value());
}

}  // namespace kvtier
