#include "server/net/connection_listener.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>

namespace kvtier {
namespace {

std::string peer_address(const sockaddr_storage& a) {
  char text[INET6_ADDRSTRLEN] = "?";
  if (a.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(a).sin_addr, text, sizeof(text));
  } else if (a.ss_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(a).sin6_addr, text, sizeof(text));
  }
  return text;
}

}  // namespace

ConnectionListener::ConnectionListener(std::string door, int max_threads, int max_connections_per_client)
    : door_(std::move(door)), max_threads_(max_threads), max_per_client_(max_connections_per_client) {}

ConnectionListener::~ConnectionListener() {
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

Result<int> ConnectionListener::bind(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string where = host + ":" + std::to_string(port);
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 || !found) {
    return io_error(door_ + ": cannot resolve " + host);
  }
  const int fd = ::socket(found->ai_family, found->ai_socktype | SOCK_CLOEXEC, found->ai_protocol);
  const int one = 1;
  // A backlog of 4096 (capped by somaxconn): a client pool starting up connects in a burst.
  const bool ok = fd >= 0 && ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0 &&
                  ::bind(fd, found->ai_addr, found->ai_addrlen) == 0 && ::listen(fd, 4096) == 0;
  const int err = errno;
  ::freeaddrinfo(found);
  if (!ok) {
    if (fd >= 0) ::close(fd);
    return io_error(door_ + ": cannot listen on " + where + ": " + std::strerror(err) +
                    " (in use, or not an address of this machine)");
  }
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  listen_fd_ = fd;
  return addr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6&>(addr).sin6_port)
                                    : ntohs(reinterpret_cast<sockaddr_in&>(addr).sin_port);
}

Status ConnectionListener::run(Serve serve, Refuse refuse) {
  if (listen_fd_ < 0) return failed_precondition(door_ + ": run() before a successful bind()");
  ConnectionThreads threads(static_cast<size_t>(max_threads_), metrics_.connections);
  while (!stopping_.load()) {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    const int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_CLOEXEC);
    if (fd < 0) {
      if (stopping_.load()) break;
      if (errno == EINTR || errno == ECONNABORTED) continue;
      metrics_.accept_failures.inc();
      error_log_.error("{}: accept failed: {}", door_, std::strerror(errno));
      // Out of descriptors or memory: a pause lets connections end instead of spinning.
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    const std::string peer = peer_address(addr);
    if (!admit(fd, peer, refuse)) continue;
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    threads.enqueue([this, fd, peer, &serve] {
      serve(fd, peer);
      forget(fd, peer);
    });
  }
  threads.shutdown();
  return ok_status();
}

bool ConnectionListener::admit(int fd, const std::string& peer, const Refuse& refuse) {
  std::unique_lock lock(mu_);
  if (stopping_.load()) {
    lock.unlock();
    ::close(fd);
    return false;
  }
  int& n = per_client_[peer];
  if (n >= max_per_client_) {
    lock.unlock();
    metrics_.refused_per_client.inc();
    refuse_log_.warn(
        "{}: refused a connection from {}: it has {} open (--max-connections-per-client)", door_,
        peer, max_per_client_);
    // Said in the door's format, so the client's first request reads why instead of a reset.
    refuse(fd, "too many connections from " + peer);
    ::close(fd);
    return false;
  }
  ++n;
  open_fds_.emplace(fd, false);
  return true;
}

void ConnectionListener::forget(int fd, const std::string& peer) {
  {
    std::lock_guard lock(mu_);
    open_fds_.erase(fd);
    if (auto it = per_client_.find(peer); it != per_client_.end() && --it->second <= 0) per_client_.erase(it);
  }
  ::close(fd);  // after leaving the set: stop() never shuts a reused descriptor
}

void ConnectionListener::stop() {
  stopping_.store(true);
  if (listen_fd_ >= 0) ::shutdown(listen_fd_, SHUT_RDWR);  // wakes accept()
  std::lock_guard lock(mu_);
  if (!open_fds_.empty()) spdlog::info("{}: closing {} connections still open", door_, open_fds_.size());
  for (const auto& [fd, in_request] : open_fds_) {
    if (!in_request) ::shutdown(fd, SHUT_RD);  // ends the waits; a reply still goes out
  }
}

bool ConnectionListener::begin_request(int fd) {
  std::lock_guard lock(mu_);
  if (stopping_.load()) return false;
  if (auto it = open_fds_.find(fd); it != open_fds_.end()) it->second = true;  // else not one it accepted
  return true;
}

void ConnectionListener::end_request(int fd) {
  std::lock_guard lock(mu_);
  auto it = open_fds_.find(fd);
  if (it == open_fds_.end()) return;
  it->second = false;
  if (stopping_.load()) ::shutdown(fd, SHUT_RD);
}

}  // namespace kvtier
