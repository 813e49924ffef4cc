#include "server/net/tls_channel.h"

#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509_vfy.h>
#include <poll.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <string>
#include <vector>

#include "server/net/tls_context.h"

namespace kvtier {
namespace {

// Pieces shorter than this are copied into one record with their neighbours (a 16-byte header
// and a namespace in records of their own would cost a record and a send each).
constexpr size_t kGatherBytes = 16 << 10;

}  // namespace

TlsChannel::TlsChannel(int fd, SSL* ssl) : fd_(fd), ssl_(ssl) {
  ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) | O_NONBLOCK);
}

TlsChannel::~TlsChannel() {
  close_notify();
  SSL_free(ssl_);
  ERR_clear_error();
}

void TlsChannel::close_notify() {
  if (closed_ || failed_) return;
  closed_ = true;
  SSL_shutdown(ssl_);
  ERR_clear_error();
}

bool TlsChannel::has_buffered() const { return SSL_has_pending(ssl_) == 1; }

Status TlsChannel::handshake(bool as_server, net::Deadline deadline) {
  for (;;) {
    const int r = as_server ? SSL_accept(ssl_) : SSL_connect(ssl_);
    if (r == 1) return ok_status();
    const int e = SSL_get_error(ssl_, r);
    short wants = e == SSL_ERROR_WANT_READ ? POLLIN : e == SSL_ERROR_WANT_WRITE ? POLLOUT : 0;
    if (wants == 0) {
      failed_ = true;
      std::string why = tls_error_text("the peer closed the connection or is not speaking TLS");
      if (!as_server && SSL_get_verify_result(ssl_) != X509_V_OK) {
        why = std::string("the server's certificate is not trusted: ") +
              X509_verify_cert_error_string(SSL_get_verify_result(ssl_));
      }
      return unavailable("TLS handshake failed: " + why);
    }
    if (!net::wait_for(fd_, wants, deadline)) {
      failed_ = true;
      return unavailable("timed out waiting for the TLS handshake");
    }
  }
}

Status TlsChannel::accept(net::Deadline deadline) { return handshake(true, deadline); }
Status TlsChannel::connect(net::Deadline deadline) { return handshake(false, deadline); }

Status TlsChannel::transfer(bool reading, uint8_t* p, size_t size, net::Deadline deadline) {
  const char* peer_side = reading ? "send" : "read";
  while (size > 0) {
    size_t n = 0;
    const int r = reading ? SSL_read_ex(ssl_, p, size, &n) : SSL_write_ex(ssl_, p, size, &n);
    if (r == 1) {
      p += n;
      size -= n;
      continue;
    }
    const int e = SSL_get_error(ssl_, r);
    if (e == SSL_ERROR_ZERO_RETURN) return unavailable("connection closed by the peer");
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
      if (!net::wait_for(fd_, e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline)) {
        return unavailable(std::string("timed out waiting for the peer to ") + peer_side);
      }
      continue;
    }
    failed_ = true;
    if (e == SSL_ERROR_SYSCALL) {  // a reset or an end of stream without close_notify
      ERR_clear_error();
      return unavailable("connection closed by the peer");
    }
    return io_error(std::string(reading ? "TLS read: " : "TLS write: ") + tls_error_text("failed"));
  }
  return ok_status();
}

Status TlsChannel::recv_exact(void* data, size_t size, net::Deadline deadline) {
  return transfer(true, static_cast<uint8_t*>(data), size, deadline);
}

Status TlsChannel::send_all(std::span<iovec> pieces, net::Deadline deadline) {
  std::vector<uint8_t> gathered;
  auto flush = [&]() -> Status {
    if (gathered.empty()) return ok_status();
    Status st = transfer(false, gathered.data(), gathered.size(), deadline);
    gathered.clear();
    return st;
  };
  for (const iovec& piece : pieces) {
    const auto* p = static_cast<const uint8_t*>(piece.iov_base);
    if (piece.iov_len < kGatherBytes) {
      gathered.insert(gathered.end(), p, p + piece.iov_len);
      if (gathered.size() >= kGatherBytes) KVTIER_RETURN_IF_ERROR(flush());
      continue;
    }
    KVTIER_RETURN_IF_ERROR(flush());
    KVTIER_RETURN_IF_ERROR(transfer(false, const_cast<uint8_t*>(p), piece.iov_len, deadline));
  }
  return flush();
}

}  // namespace kvtier
