#include "server/wire/wire_stream.h"

namespace kvtier {

Status WireStream::recv_exact(void* data, size_t size, net::Deadline deadline) {
  return tls_ ? tls_->recv_exact(data, size, deadline) : net::recv_exact(fd_, data, size, deadline);
}

Status WireStream::send_all(std::span<iovec> pieces, net::Deadline deadline) {
  return tls_ ? tls_->send_all(pieces, deadline) : net::send_all(fd_, pieces, deadline);
}

bool WireStream::wait_readable(std::chrono::milliseconds timeout) {
  return (tls_ && tls_->has_buffered()) || net::wait_readable(fd_, timeout);
}

void WireStream::linger() {
  if (tls_) tls_->close_notify();
  net::linger(fd_);
}

}  // namespace kvtier
