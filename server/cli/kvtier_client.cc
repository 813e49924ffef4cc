#include "server/cli/kvtier_client.h"

#include <csignal>

#include <httplib.h>

#include "server/net/tls_context.h"
#include "server/wire/wire_client.h"

namespace kvtier {
namespace {

using nlohmann::json;

std::string hash_path(const BlockHash& h, const std::string& ns) {
  return "/v1/blocks/" + h.hex() + (ns.empty() ? "" : "?namespace=" + httplib::detail::encode_query_param(ns));
}

json prompt_body(const std::string& ns, std::span<const uint32_t> tokens, const std::vector<std::string>& extra) {
  return {{"namespace", ns}, {"tokens", std::vector<uint32_t>(tokens.begin(), tokens.end())}, {"extra_keys", extra}};
}

Status transport_error(const httplib::Error e) {
  return unavailable("kvtierd did not answer: " + httplib::to_string(e));
}

// Every request kvtierd serves is idempotent (blocks are content-addressed), so one that failed
// on the wire is sent once more on a fresh connection: a keep-alive connection the server closed
// while idle looks alive to the client until its request is half written.
template <typename Send>
httplib::Result send_with_retry(Send&& send) {
  httplib::Result r = send();
  if (!r && (r.error() == httplib::Error::Read || r.error() == httplib::Error::Write ||
             r.error() == httplib::Error::Connection)) {
    r = send();
  }
  return r;
}

Result<json> parse_reply(const std::string& path, const std::string& body) {
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded()) return internal_error("kvtierd answered " + path + " with invalid JSON");
  return j;
}

}  // namespace

Status status_from_http(int status, const std::string& body) {
  json j = json::parse(body, nullptr, false);
  std::string message = "HTTP " + std::to_string(status);
  if (!j.is_discarded() && j.contains("error") && j["error"].contains("message")) {
    message += ": " + j["error"]["message"].get<std::string>();
  }
  switch (status) {
    case 400: case 413: return invalid_argument(message);
    case 401: return failed_precondition(message);
    case 403: return permission_denied(message);
    case 404: return not_found(message);
    case 409: return conflict(message);
    case 422: return failed_precondition(message);
    case 503: return resource_exhausted(message);
    case 507: return no_space(message);
    default: return internal_error(message);
  }
}

KvtierClient::KvtierClient(const std::string& host, int port, std::string api_key, const ClientTls& tls)
    : ignore_sigpipe_(ignore_sigpipe()),
      // Not httplib::Client("https://..."): it parses the URL with a function-local std::regex.
      http_(tls.enabled ? std::make_unique<httplib::SSLClient>(host, port)
                        : std::make_unique<httplib::ClientImpl>(host, port)),
      api_key_(std::move(api_key)),
      host_(host),
      tls_(tls.enabled),
      ca_cert_(tls.ca_cert) {
  if (tls.enabled) {
    if (!tls.ca_cert.empty()) http_->set_ca_cert_path(tls.ca_cert.c_str());
    http_->enable_server_certificate_verification(true);
  }
  http_->set_keep_alive(true);
  http_->set_tcp_nodelay(true);
  http_->set_connection_timeout(5);
  http_->set_read_timeout(60);
  http_->set_write_timeout(60);
  if (!api_key_.empty()) http_->set_bearer_token_auth(api_key_);
}

KvtierClient::~KvtierClient() = default;

bool KvtierClient::ignore_sigpipe() {
  // Writing to a connection the server closed (a keep-alive that timed out between requests)
  // raises SIGPIPE, whose default kills the process; OpenSSL writes without MSG_NOSIGNAL. The
  // write must fail instead, so the retry can reconnect. cpp-httplib's server does the same.
  static const bool done = [] {
    std::signal(SIGPIPE, SIG_IGN);
    return true;
  }();
  return done;
}

HttpReply KvtierClient::raw(const std::string& method, const std::string& path, const std::string& body,
                            const std::string& content_type, const std::optional<std::string>& authorization) {
  httplib::Request req;
  req.method = method;
  req.path = path;
  req.body = body;
  if (!body.empty() || method == "POST" || method == "PUT") req.set_header("Content-Type", content_type);
  if (authorization) req.set_header("Authorization", *authorization);
  else if (!api_key_.empty()) req.set_header("Authorization", "Bearer " + api_key_);
  auto res = send_with_retry([&] { return http_->send(req); });
  if (!res) return {0, "", httplib::to_string(res.error())};
  return {res->status, res->body, ""};
}

Result<json> KvtierClient::post_json(const std::string& path, const json& body) {
  auto res = send_with_retry([&] { return http_->Post(path, body.dump(), "application/json"); });
  if (!res) return transport_error(res.error());
  if (res->status != 200) return status_from_http(res->status, res->body);
  return parse_reply(path, res->body);
}

Status KvtierClient::healthz() {
  auto res = send_with_retry([&] { return http_->Get("/healthz"); });
  if (!res) return transport_error(res.error());
  return res->status == 200 ? ok_status() : status_from_http(res->status, res->body);
}

Result<json> KvtierClient::layout() {
  auto res = send_with_retry([&] { return http_->Get("/v1/layout"); });
  if (!res) return transport_error(res.error());
  if (res->status != 200) return status_from_http(res->status, res->body);
  return parse_reply("/v1/layout", res->body);
}

Result<json> KvtierClient::lookup(const std::string& ns, std::span<const uint32_t> tokens,
                                  const std::vector<std::string>& extra_keys) {
  return post_json("/v1/lookup", prompt_body(ns, tokens, extra_keys));
}

Result<json> KvtierClient::prefetch(const std::string& ns, std::span<const uint32_t> tokens,
                                    const std::vector<std::string>& extra_keys) {
  return post_json("/v1/prefetch", prompt_body(ns, tokens, extra_keys));
}

WireClient* KvtierClient::wire() {
  if (binary_checked_) return wire_.get();
  binary_checked_ = true;
  if (!binary_allowed_) return nullptr;
  auto res = send_with_retry([&] { return http_->Get("/healthz"); });
  if (!res || res->status != 200) return nullptr;
  json j = json::parse(res->body, nullptr, false);
  if (!j.is_object() || !j.contains("binary_port") || !j["binary_port"].is_number_integer()) return nullptr;
  // The port speaks TLS exactly when HTTP does; a client that verifies the server never takes a
  // clear-text port, and one that does not cannot talk to a TLS port.
  const bool port_tls = j.contains("binary_tls") && j["binary_tls"].is_boolean() && j["binary_tls"].get<bool>();
  if (port_tls != tls_) return nullptr;
  std::shared_ptr<const TlsContext> context;
  if (tls_) {
    auto c = TlsContext::client(ca_cert_);
    if (!c.ok()) return nullptr;  // HTTPS, with the same trust settings, reports the problem
    context = std::move(c).value();
  }
  wire_ = std::make_unique<WireClient>(host_, j["binary_port"].get<int>(), api_key_, std::move(context));
  return wire_.get();
}

bool KvtierClient::wire_answered(const Status& status) {
  if (status.ok() || wire_->ever_connected()) return true;
  wire_.reset();  // a port the server offers but this client cannot reach (a firewall): HTTP
  return false;
}

Result<bool> KvtierClient::put(const BlockHash& hash, std::span<const uint8_t> document, const std::string& ns) {
  if (WireClient* w = wire()) {
    auto r = w->put(hash, document, ns);
    if (wire_answered(r.status())) return r;
  }
  auto res = send_with_retry([&] { return http_->Put(hash_path(hash, ns), reinterpret_cast<const char*>(document.data()), document.size(),
                        "application/octet-stream"); });
  if (!res) return transport_error(res.error());
  if (res->status == 201 || res->status == 200) return res->status == 201;
  return status_from_http(res->status, res->body);
}

Result<Bytes> KvtierClient::get(const BlockHash& hash, const std::string& ns) {
  if (WireClient* w = wire()) {
    auto r = w->get(hash, ns);
    if (wire_answered(r.status())) return r;
  }
  Bytes out;
  auto res = send_with_retry([&] {
    out.clear();
    return http_->Get(
        hash_path(hash, ns),
        [&](const httplib::Response& r) {
          if (r.has_header("Content-Length")) out.reserve(std::stoull(r.get_header_value("Content-Length")));
          return true;
        },
        [&](const char* data, size_t n) {
          out.insert(out.end(), data, data + n);
          return true;
        });
  });
  if (!res) return transport_error(res.error());
  if (res->status != 200) return status_from_http(res->status, std::string(out.begin(), out.end()));
  return out;
}

Result<std::vector<std::optional<Bytes>>> KvtierClient::batch_get(std::span<const BlockHash> hashes,
                                                                  const std::string& ns) {
  if (WireClient* w = wire()) {
    auto r = w->batch_get(hashes, ns);
    if (wire_answered(r.status())) return r;
  }
  json body{{"hashes", json::array()}};
  for (const BlockHash& h : hashes) body["hashes"].push_back(h.hex());
  if (!ns.empty()) body["namespace"] = ns;
  auto res = send_with_retry([&] { return http_->Post("/v1/blocks:batchGet", body.dump(), "application/json"); });
  if (!res) return transport_error(res.error());
  if (res->status != 200) return status_from_http(res->status, res->body);
  std::vector<std::optional<Bytes>> out;
  const std::string& b = res->body;
  size_t pos = 0;
  while (pos < b.size()) {
    if (b.size() - pos < 8) return corruption("batchGet reply: truncated length");
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= uint64_t(static_cast<uint8_t>(b[pos + i])) << (8 * i);
    pos += 8;
    if (n > b.size() - pos) return corruption("batchGet reply: a document runs past the end");
    if (n == 0) out.emplace_back(std::nullopt);
    else out.emplace_back(Bytes(b.begin() + pos, b.begin() + pos + n));
    pos += n;
  }
  if (out.size() != hashes.size()) return corruption("batchGet reply: wrong number of entries");
  return out;
}

Status KvtierClient::erase(const BlockHash& hash, const std::string& ns) {
  if (WireClient* w = wire()) {
    Status st = w->erase(hash, ns);
    if (wire_answered(st)) return st;
  }
  auto res = send_with_retry([&] { return http_->Delete(hash_path(hash, ns)); });
  if (!res) return transport_error(res.error());
  return res->status == 204 ? ok_status() : status_from_http(res->status, res->body);
}

Result<json> KvtierClient::stats() {
  auto res = send_with_retry([&] { return http_->Get("/v1/stats"); });
  if (!res) return transport_error(res.error());
  if (res->status != 200) return status_from_http(res->status, res->body);
  return parse_reply("/v1/stats", res->body);
}

Result<std::string> KvtierClient::metrics() {
  auto res = send_with_retry([&] { return http_->Get("/metrics"); });
  if (!res) return transport_error(res.error());
  if (res->status != 200) return status_from_http(res->status, res->body);
  return res->body;
}

}  // namespace kvtier
