#include "server/wire/wire_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cstring>
#include <thread>
#include <vector>

#include "server/request_json.h"
#include "server/status_codes.h"
#include "server/wire/socket_io.h"

namespace kvtier {

using wire::Deadline;
using wire::Op;

namespace {

using Clock = std::chrono::steady_clock;

// A batch GET pins the blocks of one slice at a time while it writes them: the reply streams,
// with no cap on its total, and the server holds at most this much of it.
constexpr uint64_t kBatchSliceBytes = 64ull << 20;

std::string peer_address(const sockaddr_storage& a) {
  char text[INET6_ADDRSTRLEN] = "?";
  if (a.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(a).sin_addr, text, sizeof(text));
  } else if (a.ss_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(a).sin6_addr, text, sizeof(text));
  }
  return text;
}

iovec piece(const void* p, size_t n) { return {const_cast<void*>(p), n}; }

}  // namespace

// One connection, from its first request to its close: reads a request, answers it, and waits
// for the next. Every refusal that leaves bytes of the request unread also closes the
// connection, since those bytes cannot be told from the next request.
class WireServer::Session {
 public:
  Session(WireServer& server, int fd)
      : s_(server), fd_(fd), authenticated_(!s_.options_.tenants || s_.options_.tenants->empty()) {}

  void run() {
    while (!s_.stopping_.load()) {
      if (!wire::wait_readable(fd_, s_.options_.idle_timeout)) {
        s_.metrics_.idle_closed.inc();
        return;
      }
      const auto t0 = Clock::now();
      deadline_ = t0 + s_.options_.request_timeout;
      std::array<uint8_t, wire::kRequestHeaderBytes> head;
      if (!received(recv(head.data(), head.size()), "a request header")) return;
      auto header = wire::decode_request(head);
      if (!header.ok()) {
        s_.metrics_.protocol_errors.inc();
        refused_ = true;
        reply_error(header.status());
        return linger();
      }
      keep_open_ = true;
      const int status = handle(*header);
      s_.count(header->op, status, std::chrono::duration<double>(Clock::now() - t0).count());
      if (!keep_open_) return linger();
    }
  }

 private:
  // After a refusal with request bytes still coming: a close with unread input sends a reset,
  // which can destroy the refusal before the client reads it. Say we are done writing, then
  // discard what still arrives for a moment (a lingering close, as web servers do).
  void linger() {
    if (!refused_) return;
    ::shutdown(fd_, SHUT_WR);
    const auto until = Clock::now() + std::chrono::seconds(2);
    std::vector<uint8_t> sink(64 << 10);
    for (uint64_t discarded = 0; discarded < (64ull << 20) && Clock::now() < until;) {
      if (!wire::wait_readable(fd_, std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()))) return;
      const ssize_t n = ::recv(fd_, sink.data(), sink.size(), MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return;
      if (n > 0) discarded += static_cast<uint64_t>(n);
    }
  }

  Status recv(void* p, size_t n) {
    Status st = wire::recv_exact(fd_, p, n, deadline_);
    if (st.ok()) s_.metrics_.bytes_received.inc(n);
    return st;
  }

  Status send(std::span<iovec> pieces) {
    uint64_t n = 0;
    for (const iovec& p : pieces) n += p.iov_len;
    Status st = wire::send_all(fd_, pieces, deadline_);
    if (st.ok()) s_.metrics_.bytes_sent.inc(n);
    return st;
  }

  // False (and the connection closes) when the bytes did not come; a deadline is counted and
  // logged, a peer that hung up is not an error.
  bool received(const Status& st, const char* what) {
    if (st.ok()) return true;
    keep_open_ = false;
    if (wire::is_deadline(st)) {
      s_.metrics_.timeouts.inc();
      if (auto n = s_.error_log_.admit()) {
        spdlog::warn("wire: closed a connection that did not send {} within --request-timeout ({} similar suppressed)",
                     what, *n);
      }
    } else if (st.code() != StatusCode::kUnavailable) {
      if (auto n = s_.error_log_.admit()) spdlog::warn("wire: reading {}: {} ({} similar suppressed)", what, st.message(), *n);
    }
    return false;
  }

  int reply(int status, std::span<iovec> body = {}) {
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
    const std::string text = error_json(status == 401 ? "unauthenticated" : status == 413 ? "payload_too_large"
                                                                                           : error_code_for(st.code()),
                                        st.message())
                                 .dump();
    if (status >= 400 && status != 404) {
      if (auto n = s_.refuse_log_.admit()) spdlog::warn("wire -> {}: {} ({} similar suppressed)", status, text, *n);
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
    auto scoped = tenant_ ? namespace_of(tenant_, ns) : Result<std::string>(ns);
    if (!scoped.ok()) return h.body_bytes ? refuse(scoped.status()) : reply_error(scoped.status());
    switch (h.op) {
      case Op::kPut: return put(h, *scoped);
      case Op::kGet: return get(h, *scoped);
      case Op::kBatchGet: return batch_get(h, *scoped);
      case Op::kDelete:
        if (!s_.service_.erase(h.hash, *scoped)) return reply_error(not_found("block " + h.hash.hex() + " is not cached"));
        return reply(204);
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
  bool authenticated_;
  const Tenant* tenant_ = nullptr;
  Deadline deadline_{};
  bool keep_open_ = true;
  bool refused_ = false;  // answered before reading the whole request
};

WireServer::WireServer(BlockService& service, WireServerOptions options)
    : service_(service), options_(std::move(options)) {
  if (options_.max_body_bytes == 0) options_.max_body_bytes = service_.layout().dense_block_bytes() + (16ull << 20);
  for (Op op : {Op::kHello, Op::kPut, Op::kGet, Op::kBatchGet, Op::kDelete}) ops_[op] = std::make_unique<OpStats>();
}

WireServer::~WireServer() {
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

Result<int> WireServer::bind(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string where = host + ":" + std::to_string(port);
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 || !found) {
    return io_error("binary port: cannot resolve " + host);
  }
  const int fd = ::socket(found->ai_family, found->ai_socktype | SOCK_CLOEXEC, found->ai_protocol);
  const int one = 1;
  const bool ok = fd >= 0 && ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0 &&
                  ::bind(fd, found->ai_addr, found->ai_addrlen) == 0 && ::listen(fd, 4096) == 0;
  const int err = errno;
  ::freeaddrinfo(found);
  if (!ok) {
    if (fd >= 0) ::close(fd);
    return io_error("binary port: cannot listen on " + where + ": " + std::strerror(err));
  }
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  listen_fd_ = fd;
  return addr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6&>(addr).sin6_port)
                                    : ntohs(reinterpret_cast<sockaddr_in&>(addr).sin_port);
}

void WireServer::run() {
  threads_ = std::make_unique<ConnectionThreads>(static_cast<size_t>(options_.threads), metrics_.connections);
  while (!stopping_.load()) {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    const int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_CLOEXEC);
    if (fd < 0) {
      if (stopping_.load()) break;
      if (errno == EINTR || errno == ECONNABORTED) continue;
      metrics_.accept_failures.inc();
      if (auto n = error_log_.admit()) spdlog::error("wire: accept failed: {} ({} similar suppressed)", std::strerror(errno), *n);
      // Out of descriptors or memory: a pause lets connections end instead of spinning.
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    const std::string peer = peer_address(addr);
    if (!admit(fd, peer)) continue;
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    threads_->enqueue([this, fd, peer] {
      Session(*this, fd).run();
      forget(fd, peer);
    });
  }
  threads_->shutdown();
}

bool WireServer::admit(int fd, const std::string& peer) {
  std::unique_lock lock(mu_);
  int& n = per_client_[peer];
  if (n >= options_.max_connections_per_client && !stopping_.load()) {
    if (n == 0) per_client_.erase(peer);
    lock.unlock();
    metrics_.refused_per_client.inc();
    if (auto k = refuse_log_.admit()) {
      spdlog::warn("wire: refused a connection from {}: it has {} open (--max-connections-per-client; {} similar suppressed)",
                   peer, options_.max_connections_per_client, *k);
    }
    // Said in a response frame, so the client's first request reads why instead of a reset.
    const std::string text = error_json("resource_exhausted", "too many connections from " + peer).dump();
    auto head = wire::encode(wire::ResponseHeader{503, text.size()});
    std::array<iovec, 2> pieces{piece(head.data(), head.size()), piece(text.data(), text.size())};
    (void)wire::send_all(fd, pieces, Clock::now() + std::chrono::milliseconds(100));
    ::close(fd);
    return false;
  }
  if (stopping_.load()) {
    lock.unlock();
    ::close(fd);
    return false;
  }
  ++n;
  open_fds_.insert(fd);
  return true;
}

void WireServer::forget(int fd, const std::string& peer) {
  {
    std::lock_guard lock(mu_);
    open_fds_.erase(fd);
    if (auto it = per_client_.find(peer); it != per_client_.end() && --it->second <= 0) per_client_.erase(it);
  }
  ::close(fd);  // after leaving the set: stop() never shuts a reused descriptor
}

void WireServer::stop() {
  stopping_.store(true);
  if (listen_fd_ >= 0) ::shutdown(listen_fd_, SHUT_RDWR);  // wakes accept()
  std::lock_guard lock(mu_);
  for (int fd : open_fds_) ::shutdown(fd, SHUT_RD);  // ends the waits; a reply still goes out
}

void WireServer::count(Op op, int status, double seconds) {
  OpStats& s = *ops_.at(op);
  s.seconds.observe(seconds);
  if (status == 0) return;  // the request never arrived whole
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
  v.counter("kvtier_wire_connections_total", "Binary-protocol connections accepted", {}, m.connections.accepted.value());
  v.gauge("kvtier_wire_connections_open", "Binary-protocol connections being served", {},
          static_cast<double>(m.connections.open.value()));
  v.counter("kvtier_wire_connections_refused_total", "Connections refused: the client address had its cap open",
            {{"reason", "per_client_cap"}}, m.refused_per_client.value());
  v.counter("kvtier_wire_accept_failures_total", "accept() failures other than interruptions (out of descriptors or memory)",
            {}, m.accept_failures.value());
  v.counter("kvtier_wire_idle_closed_total", "Connections closed after --idle-timeout without a request", {},
            m.idle_closed.value());
  v.counter("kvtier_wire_timeouts_total", "Connections closed: a request or reply outlasted --request-timeout", {},
            m.timeouts.value());
  v.counter("kvtier_wire_protocol_errors_total", "Requests that were not binary-protocol frames", {},
            m.protocol_errors.value());
  v.counter("kvtier_wire_received_bytes_total", "Bytes of binary-protocol requests", {}, m.bytes_received.value());
  v.counter("kvtier_wire_sent_bytes_total", "Bytes of binary-protocol replies", {}, m.bytes_sent.value());
}

}  // namespace kvtier
