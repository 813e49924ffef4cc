// TlsChannel: TLS over one connected socket, with the deadlines and the error conventions of
// base/net/socket_io.h, for the binary protocol's two ends. Reads decrypt straight into the
// caller's buffer (a block body lands where the block will live); writes gather small pieces
// into one record and send large ones from where they lie.
#pragma once

#include <sys/uio.h>

#include <span>

#include "base/net/socket_io.h"
#include "base/status.h"

typedef struct ssl_st SSL;

namespace kvtier {

// Not thread-safe; one per connection.
class TlsChannel {
 public:
  // `ssl` (set on `fd`) is owned from here on; `fd` is not, and is made non-blocking.
  TlsChannel(int fd, SSL* ssl);
  ~TlsChannel();
  TlsChannel(const TlsChannel&) = delete;
  TlsChannel& operator=(const TlsChannel&) = delete;

  // The handshake as the server (accept) or the client (connect, which also checks the
  // certificate against the session's verification settings), done by `deadline`.
  Status accept(net::Deadline deadline);
  Status connect(net::Deadline deadline);
  // As net::recv_exact and net::send_all: kUnavailable when the peer closed or the deadline
  // passed (net::is_deadline tells), kIoError for a TLS failure.
  Status recv_exact(void* data, size_t size, net::Deadline deadline);
  Status send_all(std::span<iovec> pieces, net::Deadline deadline);
  // Decrypted or undecrypted bytes held inside OpenSSL: readable without waiting for the socket.
  bool has_buffered() const;
  // Says the close was meant (close_notify), once, without waiting for the peer's.
  void close_notify();

 private:
  Status handshake(bool as_server, net::Deadline deadline);
  // Reads into, or writes from, `size` bytes at `p` in full (SSL_write never writes to `p`).
  Status transfer(bool reading, uint8_t* p, size_t size, net::Deadline deadline);

  const int fd_;
  SSL* ssl_;
  bool failed_ = false;  // a fatal TLS error: no close_notify may follow
  bool closed_ = false;
};

}  // namespace kvtier
