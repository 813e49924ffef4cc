#include "base/net/socket_io.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <string>
#include <vector>

namespace kvtier::net {
namespace {

int millis_until(Deadline deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1 << 30));
}

Status socket_error(const char* what, int err) {
  if (err == ECONNRESET || err == EPIPE || err == ENOTCONN) return unavailable(std::string("connection closed by the peer during ") + what);
  return io_error(std::string(what) + ": " + std::strerror(err));
}

}  // namespace

bool wait_for(int fd, short events, Deadline deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, millis_until(deadline));
    if (n > 0) return true;
    if (n == 0) return false;
    if (errno != EINTR) return true;  // let the next call report the error
  }
}

Status recv_exact(int fd, void* data, size_t size, Deadline deadline) {
  auto* p = static_cast<uint8_t*>(data);
  while (size > 0) {
    // Try first: on a busy connection the bytes are usually there, and poll() would be a second
    // system call per read.
    const ssize_t n = ::recv(fd, p, size, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return unavailable("connection closed by the peer");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return socket_error("recv", errno);
    if (!wait_for(fd, POLLIN, deadline)) return unavailable("timed out waiting for the peer to send");
  }
  return ok_status();
}

Status send_all(int fd, std::span<iovec> pieces, Deadline deadline) {
  size_t first = 0;
  while (first < pieces.size()) {
    if (pieces[first].iov_len == 0) {
      ++first;
      continue;
    }
    msghdr msg{};
    msg.msg_iov = &pieces[first];
    msg.msg_iovlen = std::min<size_t>(pieces.size() - first, IOV_MAX);
    ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return socket_error("send", errno);
      if (!wait_for(fd, POLLOUT, deadline)) return unavailable("timed out waiting for the peer to read");
      continue;
    }
    for (auto sent = static_cast<size_t>(n); sent > 0 && first < pieces.size(); ++first) {
      if (sent < pieces[first].iov_len) {
        pieces[first].iov_base = static_cast<uint8_t*>(pieces[first].iov_base) + sent;
        pieces[first].iov_len -= sent;
        break;
      }
      sent -= pieces[first].iov_len;
    }
  }
  return ok_status();
}

bool is_deadline(const Status& status) {
  return status.code() == StatusCode::kUnavailable && status.message().rfind("timed out", 0) == 0;
}

bool wait_readable(int fd, std::chrono::milliseconds timeout) {
  return wait_for(fd, POLLIN, std::chrono::steady_clock::now() + timeout);
}

void linger(int fd) {
  using Clock = std::chrono::steady_clock;
  ::shutdown(fd, SHUT_WR);
  const auto until = Clock::now() + std::chrono::seconds(2);
  // MSG_TRUNC: TCP drops the bytes in the kernel, no buffer of ours. A 64 KiB buffer per
  // lingering connection was 66 MiB for a thousand refused ones, outside --max-body-memory.
  for (uint64_t discarded = 0; discarded < (64ull << 20) && Clock::now() < until;) {
    if (!wait_for(fd, POLLIN, until)) return;
    const ssize_t n = ::recv(fd, nullptr, 1 << 20, MSG_DONTWAIT | MSG_TRUNC);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return;
    if (n > 0) discarded += static_cast<uint64_t>(n);
  }
}

Result<int> connect_tcp(const std::string& host, int port, std::chrono::milliseconds timeout) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0) {
    return unavailable("cannot resolve " + host + ": " + gai_strerror(rc));
  }
  std::string last = "no address";
  for (addrinfo* a = found; a; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      int err = ETIMEDOUT;
      if (wait_for(fd, POLLOUT, std::chrono::steady_clock::now() + timeout)) {
        socklen_t len = sizeof(err);
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      }
      rc = err == 0 ? 0 : -1;
      errno = err;
    }
    if (rc == 0) {
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      ::freeaddrinfo(found);
      return fd;
    }
    last = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return unavailable("cannot connect to " + host + ":" + service + ": " + last);
}

}  // namespace kvtier::net
