#include "server/wire/wire_client.h"

#include <unistd.h>

#include "server/cli/kvtier_client.h"
#include "base/net/socket_io.h"
#include "server/net/tls_context.h"

namespace kvtier {

using wire::Op;

namespace {

iovec piece(const void* p, size_t n) { return {const_cast<void*>(p), n}; }

}  // namespace

WireClient::WireClient(std::string host, int port, std::string api_key, std::shared_ptr<const TlsContext> tls)
    : host_(std::move(host)), port_(port), api_key_(std::move(api_key)), tls_(std::move(tls)) {}

WireClient::~WireClient() { disconnect(); }

std::chrono::steady_clock::time_point WireClient::deadline() const { return std::chrono::steady_clock::now() + timeout_; }

void WireClient::disconnect() {
  stream_.reset();  // its TLS close_notify goes out before the socket closes
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Status WireClient::connect() {
  KVTIER_ASSIGN_OR_RETURN(fd_, net::connect_tcp(host_, port_, std::chrono::seconds(5)));
  ever_connected_ = true;
  std::unique_ptr<TlsChannel> channel;
  if (tls_) {
    SSL* ssl = tls_->new_client_session(fd_, host_);
    if (ssl == nullptr) {
      disconnect();
      return internal_error("TLS: no session for " + host_ + ": " + tls_error_text("out of memory"));
    }
    channel = std::make_unique<TlsChannel>(fd_, ssl);
    if (Status st = channel->connect(deadline()); !st.ok()) {
      channel.reset();
      disconnect();
      // Not a connection to retry: a server whose certificate is not trusted stays untrusted.
      return st.message().find("not trusted") != std::string::npos ? failed_precondition(st.message()) : st;
    }
  }
  stream_ = std::make_unique<WireStream>(fd_, std::move(channel));
  if (api_key_.empty()) return ok_status();
  auto hello = exchange(Op::kHello, BlockHash{}, "",
                        std::span(reinterpret_cast<const uint8_t*>(api_key_.data()), api_key_.size()));
  if (!hello.ok()) return hello.status();
  if (hello->status != 200) return error_of(*hello);
  return ok_status();
}

Result<WireClient::Reply> WireClient::exchange(Op op, const BlockHash& hash, const std::string& ns,
                                               std::span<const uint8_t> body) {
  auto head = wire::encode(wire::RequestHeader{op, static_cast<uint16_t>(ns.size()), body.size(), hash});
  std::array<iovec, 3> pieces{piece(head.data(), head.size()), piece(ns.data(), ns.size()),
                              piece(body.data(), body.size())};
  const auto until = deadline();
  Status sent = stream_->send_all(pieces, until);
  // A refusal can come before the whole body went out (the server closes after answering it):
  // read the answer whatever the send said.
  std::array<uint8_t, wire::kResponseHeaderBytes> reply;
  Status got = stream_->recv_exact(reply.data(), reply.size(), until);
  if (!got.ok()) {
    disconnect();
    return sent.ok() ? got : sent;
  }
  auto decoded = wire::decode_response(reply);
  if (!decoded.ok()) {
    disconnect();
    return decoded.status();
  }
  return Reply{decoded->status, decoded->body_bytes};
}

Result<WireClient::Reply> WireClient::exchange_with_retry(Op op, const BlockHash& hash, const std::string& ns,
                                                          std::span<const uint8_t> body) {
  if (ns.size() > wire::kMaxNamespaceBytes) return invalid_argument("a namespace is at most 1024 bytes");
  const bool fresh = fd_ < 0;
  if (fresh) KVTIER_RETURN_IF_ERROR(connect());
  auto reply = exchange(op, hash, ns, body);
  // A kept connection the server closed while idle fails on first use: once more, on a new one.
  if (!reply.ok() && !fresh && reply.status().code() == StatusCode::kUnavailable) {
    KVTIER_RETURN_IF_ERROR(connect());
    reply = exchange(op, hash, ns, body);
  }
  return reply;
}

Status WireClient::error_of(const Reply& reply) {
  std::string body(std::min<uint64_t>(reply.body_bytes, 1 << 20), '\0');
  if (reply.body_bytes > body.size() || !stream_->recv_exact(body.data(), body.size(), deadline()).ok()) {
    disconnect();
  }
  return status_from_http(reply.status, body);
}

Result<bool> WireClient::put(const BlockHash& hash, std::span<const uint8_t> document, const std::string& ns) {
  KVTIER_ASSIGN_OR_RETURN(Reply r, exchange_with_retry(Op::kPut, hash, ns, document));
  if (r.status != 200 && r.status != 201) return error_of(r);
  if (r.body_bytes != 0) {
    disconnect();
    return internal_error("kvtierd answered a PUT with a body");
  }
  return r.status == 201;
}

Result<Bytes> WireClient::get(const BlockHash& hash, const std::string& ns) {
  KVTIER_ASSIGN_OR_RETURN(Reply r, exchange_with_retry(Op::kGet, hash, ns, {}));
  if (r.status != 200) return error_of(r);
  if (r.body_bytes > (1ull << 40)) {
    disconnect();
    return internal_error("kvtierd answered a GET with a " + std::to_string(r.body_bytes) + "-byte body");
  }
  Bytes doc(r.body_bytes);
  if (Status st = stream_->recv_exact(doc.data(), doc.size(), deadline()); !st.ok()) {
    disconnect();
    return st;
  }
  return doc;
}

Result<std::vector<std::optional<Bytes>>> WireClient::batch_get(std::span<const BlockHash> hashes,
                                                                const std::string& ns) {
  static_assert(sizeof(BlockHash) == BlockHash::kSize);
  KVTIER_ASSIGN_OR_RETURN(Reply r, exchange_with_retry(Op::kBatchGet, BlockHash{}, ns,
                                                       std::span(reinterpret_cast<const uint8_t*>(hashes.data()),
                                                                 hashes.size_bytes())));
  if (r.status != 200) return error_of(r);
  if (r.body_bytes != wire::kStreamedBody) {
    disconnect();
    return internal_error("kvtierd answered a batch GET without its item stream");
  }
  std::vector<std::optional<Bytes>> out(hashes.size());
  for (auto& item : out) {
    uint8_t len[8];
    Status st = stream_->recv_exact(len, sizeof(len), deadline());
    uint64_t n = 0;
    for (int b = 0; b < 8; ++b) n |= static_cast<uint64_t>(len[b]) << (8 * b);
    if (st.ok() && n > 0) {
      item.emplace(n);
      st = stream_->recv_exact(item->data(), n, deadline());
    }
    if (!st.ok()) {
      disconnect();
      return st;
    }
  }
  return out;
}

Status WireClient::erase(const BlockHash& hash, const std::string& ns) {
  KVTIER_ASSIGN_OR_RETURN(Reply r, exchange_with_retry(Op::kDelete, hash, ns, {}));
  if (r.status != 204) return error_of(r);
  return ok_status();
}

}  // namespace kvtier
