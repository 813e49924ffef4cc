#include "server/net/connection_stream.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <climits>
#include <cstring>

#include "server/net/tls_context.h"
#include "base/net/socket_io.h"

namespace kvtier {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kReadBufferBytes = 64 << 10;

void address_of(const sockaddr_storage& a, std::string& ip, int& port) {
  char text[INET6_ADDRSTRLEN] = "";
  if (a.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(a);
    ::inet_ntop(AF_INET, &v4.sin_addr, text, sizeof(text));
    port = ntohs(v4.sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto& v6 = reinterpret_cast<const sockaddr_in6&>(a);
    ::inet_ntop(AF_INET6, &v6.sin6_addr, text, sizeof(text));
    port = ntohs(v6.sin6_port);
  }
  ip = text;
}

// What an OpenSSL call that returned `r` needs before it is retried: POLLIN or POLLOUT, or 0
// when it failed for good.
short tls_wants(SSL* ssl, int r) {
  switch (SSL_get_error(ssl, r)) {
    case SSL_ERROR_WANT_READ: return POLLIN;
    case SSL_ERROR_WANT_WRITE: return POLLOUT;
    default: ERR_clear_error(); return 0;
  }
}

}  // namespace

ConnectionStream::ConnectionStream(int fd, SSL* ssl, std::chrono::milliseconds write_timeout)
    : fd_(fd), ssl_(ssl), write_timeout_(write_timeout), buffer_(new char[kReadBufferBytes]) {
  ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) | O_NONBLOCK);
}

ConnectionStream::~ConnectionStream() {
  if (!ssl_) return;
  if (!timed_out_ && !closed_) SSL_shutdown(ssl_);  // one try: tells the peer the close was meant
  SSL_free(ssl_);
  ERR_clear_error();
}

Status ConnectionStream::handshake(Deadline deadline) {
  if (!ssl_) return ok_status();
  for (;;) {
    const int r = SSL_accept(ssl_);
    if (r == 1) return ok_status();
    const short wants = tls_wants(ssl_, r);
    if (wants == 0) return unavailable("TLS handshake failed: " + tls_error_text("the peer is not speaking TLS"));
    if (!net::wait_for(fd_, wants, deadline)) {
      timed_out_ = true;
      return unavailable("TLS handshake not done within --request-timeout");
    }
  }
}

void ConnectionStream::linger() {
  if (ssl_ && !closed_) {
    SSL_shutdown(ssl_);
    closed_ = true;
  }
  net::linger(fd_);
}

bool ConnectionStream::wait_request(std::chrono::milliseconds timeout) {
  if (buffered() > 0 || (ssl_ && SSL_pending(ssl_) > 0)) return true;
  return net::wait_for(fd_, POLLIN, Clock::now() + timeout);
}

ssize_t ConnectionStream::receive(char* p, size_t size) {
  const int n = static_cast<int>(std::min<size_t>(size, INT_MAX));
  for (;;) {
    short wants = POLLIN;
    if (ssl_) {
      const int r = SSL_read(ssl_, p, n);
      if (r > 0) return r;
      if (SSL_get_error(ssl_, r) == SSL_ERROR_ZERO_RETURN) return 0;
      wants = tls_wants(ssl_, r);
      if (wants == 0) return -1;
    } else {
      const ssize_t r = ::recv(fd_, p, static_cast<size_t>(n), 0);
      if (r >= 0) return r;
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
    }
    if (!net::wait_for(fd_, wants, read_deadline_)) {
      timed_out_ = true;
      return -1;
    }
  }
}

bool ConnectionStream::is_readable() const {
  if (buffered() > 0 || (ssl_ && SSL_pending(ssl_) > 0)) return true;
  return net::wait_for(fd_, POLLIN, read_deadline_);
}

bool ConnectionStream::is_writable() const { return !timed_out_ && net::wait_for(fd_, POLLOUT, Clock::now() + write_timeout_); }

ssize_t ConnectionStream::read(char* ptr, size_t size) {
  if (size == 0) return 0;
  if (buffered() == 0) {
    if (size >= kReadBufferBytes) return receive(ptr, size);
    const ssize_t n = receive(buffer_.get(), kReadBufferBytes);
    if (n <= 0) return n;
    begin_ = 0;
    end_ = static_cast<size_t>(n);
  }
  const size_t n = std::min(size, buffered());
  std::memcpy(ptr, buffer_.get() + begin_, n);
  begin_ += n;
  return static_cast<ssize_t>(n);
}

ssize_t ConnectionStream::write(const char* ptr, size_t size) {
  size_t done = 0;
  while (done < size) {
    short wants = POLLOUT;
    if (ssl_) {
      const int r = SSL_write(ssl_, ptr + done, static_cast<int>(std::min<size_t>(size - done, INT_MAX)));
      if (r > 0) {
        done += static_cast<size_t>(r);
        continue;
      }
      wants = tls_wants(ssl_, r);
      if (wants == 0) return -1;
    } else {
      const ssize_t r = ::send(fd_, ptr + done, size - done, MSG_NOSIGNAL);
      if (r > 0) {
        done += static_cast<size_t>(r);
        continue;
      }
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return -1;
    }
    // Each wait starts afresh: a long reply is fine as long as the client keeps reading it.
    if (!net::wait_for(fd_, wants, Clock::now() + write_timeout_)) {
      timed_out_ = true;
      return -1;
    }
  }
  return static_cast<ssize_t>(size);
}

void ConnectionStream::get_remote_ip_and_port(std::string& ip, int& port) const {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  if (::getpeername(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0) address_of(a, ip, port);
}

void ConnectionStream::get_local_ip_and_port(std::string& ip, int& port) const {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0) address_of(a, ip, port);
}

}  // namespace kvtier
