// WireStream: the byte stream one binary-protocol connection runs on — the socket itself, or TLS
// over it — so the server's sessions and the client speak the same frames either way. The plain
// path is base/net/socket_io's (one gathered sendmsg, reads into the caller's buffer); the TLS
// path is TlsChannel's.
#pragma once

#include <sys/uio.h>

#include <chrono>
#include <memory>
#include <span>

#include "base/net/socket_io.h"
#include "server/net/tls_channel.h"

namespace kvtier {

// Not thread-safe; one per connection. Does not own the socket.
class WireStream {
 public:
  explicit WireStream(int fd, std::unique_ptr<TlsChannel> tls = nullptr) : fd_(fd), tls_(std::move(tls)) {}

  bool secure() const { return tls_ != nullptr; }
  TlsChannel* tls() { return tls_.get(); }
  Status recv_exact(void* data, size_t size, net::Deadline deadline);
  Status send_all(std::span<iovec> pieces, net::Deadline deadline);
  // Something to read (or the end of the stream) within `timeout`.
  bool wait_readable(std::chrono::milliseconds timeout);
  // net::linger, after a TLS close_notify.
  void linger();

 private:
  const int fd_;
  std::unique_ptr<TlsChannel> tls_;
};

}  // namespace kvtier
