// TlsContext: the server side of TLS (OpenSSL), loaded once from --tls-cert/--tls-key. It hands
// out one SSL session per accepted connection; the handshake and the reads and writes happen in
// ConnectionStream, under the same deadlines as a plain connection.
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
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  // A server session on `fd` (the caller frees it with SSL_free); null when OpenSSL is out of
  // memory.
  SSL* new_session(int fd) const;

 private:
  explicit TlsContext(SSL_CTX* ctx) : ctx_(ctx) {}
  SSL_CTX* ctx_;
};

// The reason OpenSSL gave for the last failure on this thread, or `fallback`.
std::string tls_error_text(const char* fallback);

}  // namespace kvtier
