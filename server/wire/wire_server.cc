#include "server/wire/wire_server.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cstring>
#include <thread>
#include <vector>

#include "base/elapsed.h"
#include "base/net/socket_io.h"
#include "server/http/request_json.h"
#include "server/net/tls_context.h"
#include "server/status_codes.h"
#include "server/wire/wire_stream.h"

namespace kvtier {

using net::Deadline;
using wire::Op;

static_assert(wire::kMaxNamespaceBytes == kMaxNamespaceBytes, "both doors take the same namespaces");

namespace {

using Clock = std::chrono::steady_clock;

// A batch GET pins the blocks of one slice at a time while it writes them: the reply streams,
// with no cap on its total, and the server holds at most this much of it.
constexpr uint64_t kBatchSliceBytes = 64ull << 20;
// How long a body waits for --max-body-memory to have room before it is refused (503).
constexpr std::chrono::seconds kBodyBudgetWait(1);

iovec piece(const void* p, size_t n) { return {const_cast<void*>(p), n}; }

}  // namespace

// One connection, from its first request to its close: reads a request, answers it, and waits
// for the next. Every refusal that leaves bytes of the request unread also closes the
// connection, since those bytes cannot be told from the next request.
class WireServer::Session {
 public:
  Session(WireServer& server, int fd, std::unique_ptr<TlsChannel> tls)
      : s_(server),
        fd_(fd),
        stream_(fd, std::move(tls)),
        authenticated_(!s_.options_.tenants || s_.options_.tenants->empty()) {}

  void run() {
    while (!s_.listener_.stopping()) {
      if (!stream_.wait_readable(s_.options_.idle_timeout)) {
        s_.metrics_.idle_closed.inc();
        return;
      }
      // A request that began before a shutdown is served to its end; one after it is not read.
      if (!s_.listener_.begin_request(fd_)) return;
      const auto t0 = Clock::now();
      deadline_ = t0 + s_.options_.request_timeout;
      std::array<uint8_t, wire::kRequestHeaderBytes> head;
      if (!received(recv(head.data(), head.size()), "a request header")) return;
      auto header = wire::decode_request(head);
      if (!header.ok()) {
        s_.metrics_.protocol_errors.inc();  // not a request of any op
        refused_ = true;
        counted_ = true;
        reply_error(header.status());
        return linger();
      }
      keep_open_ = true;
      op_ = header->op;
      counted_ = false;
      handle(*header);
      s_.listener_.end_request(fd_);
      s_.ops_.at(op_)->seconds.observe(seconds_since(t0));
      if (!keep_open_) return linger();
    }
  }

 private:
  void linger() {
    if (refused_) stream_.linger();
  }

  Status recv(void* p, size_t n) {
    Status st = stream_.recv_exact(p, n, deadline_);
    if (st.ok()) s_.metrics_.bytes_received.inc(n);
    return st;
  }

  Status send(std::span<iovec> pieces) {
    uint64_t n = 0;
    for (const iovec& p : pieces) n += p.iov_len;
    // A reply may be a stream of gigabytes: each write (at most one 64 MiB slice) gets the whole
    // --request-timeout, so only a client that stops reading loses its connection.
    Status st = stream_.send_all(pieces, Clock::now() + s_.options_.request_timeout);
    if (st.ok()) {
      s_.metrics_.bytes_sent.inc(n);
    } else if (net::is_deadline(st)) {
      s_.metrics_.timeouts.inc();
      s_.error_log_.warn(
          "wire: closed a connection that did not read its reply within --request-timeout");
    }
    return st;
  }

  // False (and the connection closes) when the bytes did not come; a deadline is counted and
  // logged, a peer that hung up is not an error.
  bool received(const Status& st, const char* what) {
    if (st.ok()) return true;
    keep_open_ = false;
    if (net::is_deadline(st)) {
      s_.metrics_.timeouts.inc();
      s_.error_log_.warn("wire: closed a connection that did not send {} within --request-timeout",
                         what);
    } else if (st.code() != StatusCode::kUnavailable) {
      s_.error_log_.warn("wire: reading {}: {}", what, st.message());
    }
    return false;
  }

  int reply(int status, std::span<iovec> body = {}) {
    // Counted before it goes out: a client that reads the metrics next sees this request in them.
    if (!counted_) s_.count(op_, status);
    counted_ = true;
    uint64_t n = 0;
    for (const iovec& p : body) n += p.iov_len;
    auto head = wire::encode(wire::ResponseHeader{static_cast<uint16_t>(status), n});
    std::vector<iovec> pieces{piece(head.data(), head.size())};
    pieces.insert(pieces.end(), body.begin(), body.end());
    if (!send(pieces).ok()) keep_open_ = false;
    return status;
  }

  int reply_error(const Status& st, int status = 0) {
    if (status == 0) status = http_status_for(st.code());
    const std::string text = json_text(error_json(status == 401   ? "unauthenticated"
                                                  : status == 413 ? "payload_too_large"
                                                                  : error_code_for(st.code()),
                                                  st.message()));
    if (status >= 400 && status != 404) {
      s_.refuse_log_.warn("wire -> {}: {}", status, text);
    }
    iovec body = piece(text.data(), text.size());
    return reply(status, std::span(&body, 1));
  }

  // A refusal before the body was read: the connection cannot go on.
  int refuse(const Status& st, int status = 0) {
    const int answered = reply_error(st, status);
    keep_open_ = false;
    refused_ = true;
    return answered;
  }

  std::optional<BodyBudget::Lease> take_budget(uint64_t bytes, const char* what) {
    return s_.service_.body_budget().take(bytes, std::min(deadline_, Clock::now() + kBodyBudgetWait), what);
  }

  int handle(const wire::RequestHeader& h) {
    if (h.namespace_bytes > wire::kMaxNamespaceBytes) {
      return refuse(invalid_argument("a namespace is at most " + std::to_string(wire::kMaxNamespaceBytes) + " bytes"));
    }
    std::string ns(h.namespace_bytes, '\0');
    if (!received(recv(ns.data(), ns.size()), "a namespace")) return 0;
    if (h.op == Op::kHello) return hello(h);
    if (!authenticated_) return refuse(invalid_argument("send HELLO with an API key first"), 401);
    if (h.op != Op::kPut && h.op != Op::kBatchGet && h.body_bytes != 0) {
      return refuse(invalid_argument(std::string(wire::op_name(h.op)) + " takes no body"));
    }
    // Checked before the key's rights, as HTTP does: the same mistake gets the same status.
    if (!ns.empty()) {
      if (Status st = check_namespace(ns); !st.ok()) return h.body_bytes ? refuse(st) : reply_error(st);
    }
    auto scoped = tenant_ ? namespace_of(tenant_, ns) : Result<std::string>(ns);
    if (!scoped.ok()) return h.body_bytes ? refuse(scoped.status()) : reply_error(scoped.status());
    switch (h.op) {
      case Op::kPut: return put(h, *scoped);
      case Op::kGet: return get(h, *scoped);
      case Op::kBatchGet: return batch_get(h, *scoped);
      case Op::kDelete: {
        auto erased = s_.service_.erase(h.hash, *scoped);
        if (!erased.ok()) return reply_error(erased.status());
        if (!*erased) return reply_error(not_found("block " + h.hash.hex() + " is not cached"));
        return reply(204);
      }
      case Op::kHello: break;
    }
    return refuse(internal_error("unhandled op"));
  }

  int hello(const wire::RequestHeader& h) {
    if (h.body_bytes > wire::kMaxKeyBytes) return refuse(invalid_argument("an API key is at most 4096 bytes"));
    std::string key(h.body_bytes, '\0');
    if (!received(recv(key.data(), key.size()), "an API key")) return 0;
    if (authenticated_ && !tenant_) return reply(200);  // auth is off: any key will do
    tenant_ = s_.options_.tenants->authenticate(key);
    authenticated_ = tenant_ != nullptr;
    if (!tenant_) return refuse(invalid_argument("wrong API key"), 401);
    return reply(200);
  }

  int put(const wire::RequestHeader& h, const std::string& ns) {
    if (h.body_bytes > s_.options_.max_body_bytes) {
      return refuse(invalid_argument("the body is " + std::to_string(h.body_bytes) + " bytes; at most " +
                                     std::to_string(s_.options_.max_body_bytes) + " are accepted"),
                    413);
    }
    // Received straight into the buffer the stored block keeps: no copy of the KV on the way in.
    // Its bytes come from the server-wide budget before it is allocated.
    auto lease = take_budget(h.body_bytes, "a PUT body");
    if (!lease) return refuse(resource_exhausted("request bodies hold all of --max-body-memory; retry"));
    AlignedBuffer body(std::max<uint64_t>(h.body_bytes, 1), 64, /*zeroed=*/false);
    if (!received(recv(body.data(), h.body_bytes), "a block document")) return 0;
    auto outcome = s_.service_.put(h.hash, std::move(body), h.body_bytes, ns);
    if (!outcome.ok()) return reply_error(outcome.status());
    return reply(*outcome == InsertOutcome::kInserted ? 201 : 200);
  }

  int get(const wire::RequestHeader& h, const std::string& ns) {
    auto doc = s_.service_.get(h.hash, ns);
    if (!doc.ok()) return reply_error(doc.status());
    // The KV goes out from where the tier holds it, in the same write as its header.
    std::array<iovec, 2> body{piece(doc->head.data(), doc->head.size()),
                              piece(doc->block->data().data(), doc->block->data().size())};
    return reply(200, body);
  }

  int batch_get(const wire::RequestHeader& h, const std::string& ns) {
    if (h.body_bytes % BlockHash::kSize != 0 || h.body_bytes / BlockHash::kSize > wire::kMaxBatchHashes) {
      return refuse(invalid_argument("a batch GET body is whole 32-byte hashes, at most " +
                                     std::to_string(wire::kMaxBatchHashes) + " of them"));
    }
    auto lease = take_budget(h.body_bytes, "a batch GET body");
    if (!lease) return refuse(resource_exhausted("request bodies hold all of --max-body-memory; retry"));
    std::vector<BlockHash> hashes(h.body_bytes / BlockHash::kSize);
    if (!received(recv(hashes.data(), h.body_bytes), "batch GET hashes")) return 0;
    auto head = wire::encode(wire::ResponseHeader{200, wire::kStreamedBody});
    iovec first = piece(head.data(), head.size());
    if (!send(std::span(&first, 1)).ok()) {
      keep_open_ = false;
      return 200;
    }
    const size_t slice = static_cast<size_t>(
        std::max<uint64_t>(1, kBatchSliceBytes / std::max<uint64_t>(1, s_.service_.layout().dense_block_bytes())));
    for (size_t at = 0; at < hashes.size(); at += slice) {
      const size_t n = std::min(slice, hashes.size() - at);
      auto docs = s_.service_.batch_get(std::span(hashes).subspan(at, n), ns);
      std::vector<std::array<uint8_t, 8>> lengths(docs.size());
      std::vector<iovec> pieces;
      pieces.reserve(docs.size() * 3);
      for (size_t i = 0; i < docs.size(); ++i) {
        const uint64_t size = docs[i] ? docs[i]->size() : 0;
        for (int b = 0; b < 8; ++b) lengths[i][b] = static_cast<uint8_t>(size >> (8 * b));
        pieces.push_back(piece(lengths[i].data(), 8));
        if (!docs[i]) continue;
        pieces.push_back(piece(docs[i]->head.data(), docs[i]->head.size()));
        pieces.push_back(piece(docs[i]->block->data().data(), docs[i]->block->data().size()));
      }
      if (!send(pieces).ok()) {
        keep_open_ = false;  // the reply is cut: the client sees a closed connection, never a short item
        return 200;
      }
    }
    return 200;
  }

  WireServer& s_;
  const int fd_;
  WireStream stream_;
  bool authenticated_;
  const Tenant* tenant_ = nullptr;
  Deadline deadline_{};
  bool keep_open_ = true;
  bool refused_ = false;  // answered before reading the whole request
  Op op_ = Op::kHello;
  bool counted_ = false;
};

WireServer::WireServer(BlockService& service, WireServerOptions options)
    : service_(service),
      options_(std::move(options)),
      listener_("binary port", options_.threads, options_.max_connections_per_client) {
  if (options_.max_body_bytes == 0) options_.max_body_bytes = service_.default_max_body_bytes();
  for (Op op : {Op::kHello, Op::kPut, Op::kGet, Op::kBatchGet, Op::kDelete}) ops_[op] = std::make_unique<OpStats>();
}

WireServer::~WireServer() = default;

Result<int> WireServer::bind(const std::string& host, int port) { return listener_.bind(host, port); }

void WireServer::run() {
  const Status st = listener_.run([this](int fd, const std::string&) { serve(fd); },
                                  [tls = options_.tls != nullptr](int fd, const std::string& message) {
                                    // A TLS client could not read a clear-text refusal: it sees
                                    // the connection close (and the refusal is counted).
                                    if (tls) return;
                                    const std::string text = json_text(error_json("resource_exhausted", message));
                                    auto head = wire::encode(wire::ResponseHeader{503, text.size()});
                                    std::array<iovec, 2> pieces{piece(head.data(), head.size()),
                                                                piece(text.data(), text.size())};
                                    (void)net::send_all(fd, pieces, Clock::now() + std::chrono::milliseconds(100));
                                  });
  if (!st.ok()) spdlog::error("{}", st.message());
}

void WireServer::stop() { listener_.stop(); }

void WireServer::serve(int fd) {
  if (!options_.tls) return Session(*this, fd, nullptr).run();
  SSL* ssl = options_.tls->new_session(fd);
  if (ssl == nullptr) {
    metrics_.tls_handshake_failures.inc();
    spdlog::error("wire: no TLS session for a connection: {}", tls_error_text("out of memory"));
    return;
  }
  auto tls = std::make_unique<TlsChannel>(fd, ssl);
  // The handshake gets what a request gets: a client that opens a connection and stalls loses it.
  if (Status st = tls->accept(Clock::now() + options_.request_timeout); !st.ok()) {
    metrics_.tls_handshake_failures.inc();
    error_log_.warn("wire: {}", st.message());
    return;
  }
  Session(*this, fd, std::move(tls)).run();
}

void WireServer::count(Op op, int status) {
  OpStats& s = *ops_.at(op);
  std::lock_guard lock(s.mu);
  ++s.by_status[status];
}

void WireServer::visit_metrics(MetricVisitor& v) const {
  for (const auto& [op, s] : ops_) {
    v.histogram("kvtier_wire_request_seconds", "Binary-protocol requests: time from header to reply",
                {{"op", wire::op_name(op)}}, s->seconds.snapshot());
    std::lock_guard lock(s->mu);
    for (const auto& [status, n] : s->by_status) {
      v.counter("kvtier_wire_requests_total", "Binary-protocol requests answered, by op and status",
                {{"op", wire::op_name(op)}, {"code", std::to_string(status)}}, n);
    }
  }
  const auto& m = metrics_;
  const ListenerMetrics& l = listener_.metrics();
  v.counter("kvtier_wire_connections_total", "Binary-protocol connections accepted", {}, l.connections.accepted.value());
  v.gauge("kvtier_wire_connections_open", "Binary-protocol connections being served", {},
          static_cast<double>(l.connections.open.value()));
  v.counter("kvtier_wire_connections_refused_total", "Connections refused: the client address had its cap open",
            {{"reason", "per_client_cap"}}, l.refused_per_client.value());
  v.counter("kvtier_wire_accept_failures_total", "accept() failures other than interruptions (out of descriptors or memory)",
            {}, l.accept_failures.value());
  v.counter("kvtier_wire_idle_closed_total", "Connections closed after --idle-timeout without a request", {},
            m.idle_closed.value());
  v.counter("kvtier_wire_timeouts_total", "Connections closed: a request or reply outlasted --request-timeout", {},
            m.timeouts.value());
  v.counter("kvtier_wire_tls_handshake_failures_total",
            "Binary-port connections closed because their TLS handshake failed or stalled", {},
            m.tls_handshake_failures.value());
  v.counter("kvtier_wire_protocol_errors_total", "Requests that were not binary-protocol frames", {},
            m.protocol_errors.value());
  v.counter("kvtier_wire_received_bytes_total", "Bytes of binary-protocol requests", {}, m.bytes_received.value());
  v.counter("kvtier_wire_sent_bytes_total", "Bytes of binary-protocol replies", {}, m.bytes_sent.value());
}

}  // namespace kvtier
