#include "server/net/tls_context.h"

#include <openssl/err.h>
#include <openssl/ssl.h>

namespace kvtier {

std::string tls_error_text(const char* fallback) {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return fallback;
  char text[256];
  ERR_error_string_n(e, text, sizeof(text));
  return text;
}

Result<std::unique_ptr<TlsContext>> TlsContext::load(const std::string& cert_file, const std::string& key_file) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
  if (!ctx) return internal_error("TLS: " + tls_error_text("cannot create a context"));
  std::unique_ptr<TlsContext> tls(new TlsContext(ctx));
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  // Writes go out in pieces as the socket takes them; a retried write may come from a buffer
  // that moved (a response body is written from wherever the block lies).
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  if (SSL_CTX_use_certificate_chain_file(ctx, cert_file.c_str()) != 1 ||
      SSL_CTX_use_PrivateKey_file(ctx, key_file.c_str(), SSL_FILETYPE_PEM) != 1 || SSL_CTX_check_private_key(ctx) != 1) {
    return invalid_argument("TLS: cannot use certificate " + cert_file + " with key " + key_file +
                            " (unreadable, not PEM, or the key does not match the certificate): " +
                            tls_error_text("no detail"));
  }
  return tls;
}

TlsContext::~TlsContext() { SSL_CTX_free(ctx_); }

SSL* TlsContext::new_session(int fd) const {
  SSL* ssl = SSL_new(ctx_);
  if (ssl && SSL_set_fd(ssl, fd) != 1) {
    SSL_free(ssl);
    return nullptr;
  }
  return ssl;
}

}  // namespace kvtier
