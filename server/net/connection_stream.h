// ConnectionStream: one accepted HTTP connection, plain or TLS, as cpp-httplib's Stream. It is
// what lets kvtierd run cpp-httplib's request parser and routes on its own accept loop: reads are
// bounded by the deadline of the request they belong to (a trickled header or body loses the
// connection), a write must make progress within the write timeout, and reads come from a 64 KiB
// buffer, so a body that cpp-httplib takes 4 KiB at a time costs one system call per 64 KiB.
#pragma once

#include <httplib.h>

#include <chrono>
#include <memory>

#include "base/status.h"

typedef struct ssl_st SSL;

namespace kvtier {

class ConnectionStream final : public httplib::Stream {
 public:
  using Deadline = std::chrono::steady_clock::time_point;

  // `ssl` (null for plain TCP) is owned from here on. The socket is made non-blocking.
  ConnectionStream(int fd, SSL* ssl, std::chrono::milliseconds write_timeout);
  ~ConnectionStream() override;
  ConnectionStream(const ConnectionStream&) = delete;
  ConnectionStream& operator=(const ConnectionStream&) = delete;

  // The TLS handshake (nothing on plain TCP), done by `deadline`.
  Status handshake(Deadline deadline);
  // True when a request's first bytes (or the peer's close) arrived within `timeout`.
  bool wait_request(std::chrono::milliseconds timeout);
  // The reads of the request starting now must be done by `deadline`.
  void begin_request(Deadline deadline) { read_deadline_ = deadline; }
  // Ends a connection whose last request was refused before its body was read (net::linger).
  void linger();
  // A read missed its request's deadline or a write made no progress for the write timeout.
  bool timed_out() const { return timed_out_; }

  bool is_readable() const override;
  bool is_writable() const override;
  ssize_t read(char* ptr, size_t size) override;
  ssize_t write(const char* ptr, size_t size) override;
  void get_remote_ip_and_port(std::string& ip, int& port) const override;
  void get_local_ip_and_port(std::string& ip, int& port) const override;
  socket_t socket() const override { return fd_; }

 private:
  // One recv/SSL_read of at most `size` bytes, waiting until the read deadline: > 0 bytes, 0 at
  // the end of the stream, -1 on an error or the deadline.
  ssize_t receive(char* p, size_t size);
  size_t buffered() const { return end_ - begin_; }

  const int fd_;
  SSL* ssl_;
  const std::chrono::milliseconds write_timeout_;
  Deadline read_deadline_{};
  bool timed_out_ = false;
  bool closed_ = false;  // TLS close_notify sent
  std::unique_ptr<char[]> buffer_;
  size_t begin_ = 0;
  size_t end_ = 0;
};

}  // namespace kvtier
