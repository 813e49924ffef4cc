// TlsContext: TLS settings (OpenSSL) — the server's, loaded once from --tls-cert/--tls-key, or a
// client's, which trusts given CAs and checks the server's host name. It hands out one SSL
// session per connection; the handshake and the reads and writes happen in ConnectionStream
// (HTTP) or TlsChannel (the binary port), under the same deadlines as a plain connection.
#pragma once

#include <memory>
#include <string>

#include "base/status.h"

typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_st SSL;

namespace kvtier {

class TlsContext {
 public:
  // A certificate chain and its private key, both PEM. TLS 1.2 and later only.
  static Result<std::unique_ptr<TlsContext>> load(const std::string& cert_file, const std::string& key_file);
  // A client's: certificates are verified against `ca_file` (PEM; empty: the system's trust
  // store), TLS 1.2 and later.
  static Result<std::unique_ptr<TlsContext>> client(const std::string& ca_file);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  // A server session on `fd` (the caller frees it with SSL_free); null when OpenSSL is out of
  // memory.
  SSL* new_session(int fd) const;
  // A client session on `fd` for `host`: sent as SNI, and the name the certificate must carry.
  SSL* new_client_session(int fd, const std::string& host) const;

 private:
  explicit TlsContext(SSL_CTX* ctx) : ctx_(ctx) {}
  SSL_CTX* ctx_;
};

// The reason OpenSSL gave for the last failure on this thread, or `fallback`.
std::string tls_error_text(const char* fallback);

}  // namespace kvtier
