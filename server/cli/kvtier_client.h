// KvtierClient: a C++ client of kvtierd, used by the `kvtier` CLI, the server tests and
// server_bench. Blocks travel as raw documents without extra copies, over the binary protocol
// when the server offers it (its /healthz names the port) and over HTTP otherwise; an error comes
// back as the Status whose code the server's HTTP status names (404 kNotFound, 409 kConflict,
// ...), with the server's message, whichever way the block went.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/memory/bytes.h"
#include "base/status.h"
#include "serialize/block_hash.h"

namespace httplib {
class ClientImpl;
}

namespace kvtier {

class WireClient;

// One HTTP exchange as it happened, for tests that check statuses and bodies themselves.
struct HttpReply {
  int status = 0;  // 0: no response (connection refused, reset, timeout)
  std::string body;
  std::string error;  // transport error when status == 0
};

// HTTPS to a kvtierd started with --tls-cert: the server's certificate is verified against
// `ca_cert` (a PEM file; empty: the system's CA store), host name included.
struct ClientTls {
  bool enabled = false;
  std::string ca_cert;
};

// Not thread-safe (one connection); one per thread. The first client ignores SIGPIPE for the
// whole process: a write to a connection the server closed must fail and be retried, not kill it.
class KvtierClient {
 public:
  KvtierClient(const std::string& host, int port, std::string api_key = "", const ClientTls& tls = {});
  ~KvtierClient();

  // false: blocks over HTTP even when the server offers the binary protocol (tests of the HTTP
  // routes). Call before the first block operation.
  void use_binary(bool allowed) { binary_allowed_ = allowed; }
  // Whether block operations go over the binary protocol (asks the server on first use).
  bool binary_in_use() { return wire() != nullptr; }

  Status healthz();
  Result<nlohmann::json> layout();
  // {"matched_tokens", "blocks": [{"hash", "tier"}], "missing": [{"hash", "parent_hash"}]}
  Result<nlohmann::json> lookup(const std::string& ns, std::span<const uint32_t> tokens,
                                const std::vector<std::string>& extra_keys = {});
  // true: stored (201); false: already held (200).
  Result<bool> put(const BlockHash& hash, std::span<const uint8_t> document, const std::string& ns = "");
  Result<Bytes> get(const BlockHash& hash, const std::string& ns = "");
  Result<std::vector<std::optional<Bytes>>> batch_get(std::span<const BlockHash> hashes,
                                                      const std::string& ns = "");
  Status erase(const BlockHash& hash, const std::string& ns = "");
  Result<nlohmann::json> prefetch(const std::string& ns, std::span<const uint32_t> tokens,
                                  const std::vector<std::string>& extra_keys = {});
  Result<nlohmann::json> stats();
  Result<std::string> metrics();

  HttpReply raw(const std::string& method, const std::string& path, const std::string& body = "",
                const std::string& content_type = "application/json",
                const std::optional<std::string>& authorization = std::nullopt);

 private:
  Result<nlohmann::json> post_json(const std::string& path, const nlohmann::json& body);

  static bool ignore_sigpipe();
  // The binary-protocol client, when the server offers one and it can be reached; else null.
  WireClient* wire();
  // After a binary call: true when its result stands; false when the port could not be reached
  // at all, and the call should go over HTTP (the binary client is then dropped).
  bool wire_answered(const Status& status);

  bool ignore_sigpipe_;  // first member: set before any connection exists
  std::unique_ptr<httplib::ClientImpl> http_;  // an SSLClient for TLS
  std::string api_key_;
  std::string host_;
  bool tls_ = false;
  std::string ca_cert_;
  bool binary_allowed_ = true;
  bool binary_checked_ = false;
  std::unique_ptr<WireClient> wire_;
};

// The Status an HTTP error reply stands for.
Status status_from_http(int status, const std::string& body);

}  // namespace kvtier
