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

Result<std::unique_ptr<TlsContext>> TlsContext::client(const std::string& ca_file) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  if (!ctx) return internal_error("TLS: " + tls_error_text("cannot create a context"));
  std::unique_ptr<TlsContext> tls(new TlsContext(ctx));
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  const int loaded = ca_file.empty() ? SSL_CTX_set_default_verify_paths(ctx)
                                     : SSL_CTX_load_verify_locations(ctx, ca_file.c_str(), nullptr);
  if (loaded != 1) {
    return invalid_argument("TLS: cannot load CA certificates" + (ca_file.empty() ? "" : " from " + ca_file) + ": " +
                            tls_error_text("no detail"));
  }
  return tls;
}

SSL* TlsContext::new_client_session(int fd, const std::string& host) const {
  SSL* ssl = new_session(fd);
  if (!ssl) return nullptr;
  // A name that is an IP address is matched against the certificate's IP entries by
  // SSL_set1_host as well; SNI is only sent for names.
  if (SSL_set1_host(ssl, host.c_str()) != 1 ||
      (host.find_first_not_of("0123456789.:") != std::string::npos && SSL_set_tlsext_host_name(ssl, host.c_str()) != 1)) {
    SSL_free(ssl);
    return nullptr;
  }
  return ssl;
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
