// ConnectionListener: the accept loop both of kvtierd's doors (HTTP and the binary port) stand
// on. It owns the listening socket, caps connections per client address (a refused connection
// is told why in its door's own format, then closed), serves each connection on a thread of its
// own, and on stop() ends at once every connection that is waiting for a request, while a request
// already begun is served to its end (its body still arrives; nothing in flight is cut).
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "base/log.h"
#include "base/metrics/metrics.h"
#include "base/status.h"
#include "server/net/connection_threads.h"

namespace kvtier {

struct ListenerMetrics {
  ConnectionMetrics connections;
  Counter refused_per_client;
  Counter accept_failures;
};

class ConnectionListener {
 public:
  // Serves one connection from accept to its end; the listener closes `fd` afterwards.
  using Serve = std::function<void(int fd, const std::string& peer)>;
  // Writes the door's refusal ("too many connections from <peer>") on `fd`; the listener closes it.
  using Refuse = std::function<void(int fd, const std::string& message)>;

  // `door` names the listener in logs ("http", "wire").
  ConnectionListener(std::string door, int max_threads, int max_connections_per_client);
  ~ConnectionListener();

  // Binds and listens (port 0 picks a free one); returns the port.
  Result<int> bind(const std::string& host, int port);
  // Accepts until stop(); returns when every connection has ended. An error when it could not
  // accept at all (never bound).
  Status run(Serve serve, Refuse refuse);
  // Thread-safe: no new connections, and every open connection between requests has its reading
  // side shut, so it ends now; one inside a request (begin_request) keeps reading its body and
  // writes its answer, and is shut when it ends the request.
  void stop();
  // A connection's thread says a request has arrived on `fd` (its first bytes are readable):
  // false once stop() was called, and the connection should close without reading it.
  bool begin_request(int fd);
  // The request is answered; after stop() the connection's reading side is shut now.
  void end_request(int fd);
  bool stopping() const { return stopping_.load(); }

  const ListenerMetrics& metrics() const { return metrics_; }

 private:
  bool admit(int fd, const std::string& peer, const Refuse& refuse);
  void forget(int fd, const std::string& peer);

  const std::string door_;
  const int max_threads_;
  const int max_per_client_;
  int listen_fd_ = -1;
  std::atomic<bool> stopping_{false};
  ListenerMetrics metrics_;
  std::mutex mu_;
  std::map<int, bool> open_fds_;  // each open connection: inside a request?
  std::map<std::string, int> per_client_;
  LogThrottle refuse_log_;
  LogThrottle error_log_;
};

}  // namespace kvtier
