#include "tiers/remote/redis_connection.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstring>

#include "base/net/socket_io.h"

namespace kvtier {
namespace {

using Clock = std::chrono::steady_clock;

// Arguments at least this long are sent from where they lie; shorter ones are copied into the
// header buffer (an iovec per key would cost more than the copy).
constexpr size_t kGatherArgumentBytes = 4096;

}  // namespace

Result<std::unique_ptr<RedisConnection>> RedisConnection::open(const RedisEndpoint& e, const std::string& user,
                                                               const std::string& password, RedisTimeouts timeouts,
                                                               RespReaderOptions reader) {
  auto fd = net::connect_tcp(e.host, e.port, timeouts.connect);
  if (!fd.ok()) return unavailable("redis " + e.text() + ": " + fd.status().message());
  const int one = 1;
  ::setsockopt(*fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  std::unique_ptr<RedisConnection> conn(new RedisConnection(e, UniqueFd(*fd), timeouts, std::move(reader)));
  if (!password.empty()) {
    RedisCommand auth = user.empty() ? RedisCommand{"AUTH", password} : RedisCommand{"AUTH", user, password};
    KVTIER_ASSIGN_OR_RETURN(RedisReply r, conn->command(auth));
    if (r.is_error()) {
      return failed_precondition("redis " + e.text() + " refused the credentials" +
                                 (user.empty() ? "" : " of user '" + user + "'") + ": " + std::string(r.str()));
    }
  }
  return conn;
}

RedisConnection::~RedisConnection() = default;

Status RedisConnection::transport_error(const std::string& what) {
  broken_ = true;
  return unavailable("redis " + endpoint_.text() + ": " + what);
}

Status RedisConnection::send(std::span<const RedisCommand> commands) {
  if (broken_) return unavailable("redis " + endpoint_.text() + ": connection is broken");
  // Two passes: the framing first (so headers_ no longer moves), then the pieces pointing into it.
  headers_.clear();
  struct Span {
    size_t header_end;                // headers_ up to here precede...
    std::string_view argument;        // ...this argument, sent in place (empty: none)
  };
  std::vector<Span> spans;
  for (const RedisCommand& cmd : commands) {
    headers_ += '*';
    headers_ += std::to_string(cmd.size());
    headers_ += "\r\n";
    for (std::string_view a : cmd) {
      headers_ += '$';
      headers_ += std::to_string(a.size());
      headers_ += "\r\n";
      if (a.size() >= kGatherArgumentBytes) {
        spans.push_back({headers_.size(), a});
      } else {
        headers_.append(a);
      }
      headers_ += "\r\n";
    }
  }
  std::vector<iovec> pieces;
  pieces.reserve(spans.size() * 2 + 1);
  size_t at = 0;
  for (const Span& s : spans) {
    pieces.push_back({headers_.data() + at, s.header_end - at});
    pieces.push_back({const_cast<char*>(s.argument.data()), s.argument.size()});
    at = s.header_end;
  }
  pieces.push_back({headers_.data() + at, headers_.size() - at});
  Status st = net::send_all(fd_.get(), pieces, Clock::now() + timeouts_.io);
  if (!st.ok()) return transport_error("writing: " + st.message());
  return ok_status();
}

Status RedisConnection::read_available() {
  if (broken_) return unavailable("redis " + endpoint_.text() + ": connection is broken");
  // Drain what the socket holds, not one read: a socket left full closes its TCP window, and the
  // node stalls until the client comes back to it.
  for (;;) {
    const std::span<uint8_t> area = reader_.write_area();
    if (area.empty()) return ok_status();  // the reader's limit: next_reply() says which
    const ssize_t n = ::recv(fd_.get(), area.data(), area.size(), MSG_DONTWAIT);
    if (n > 0) {
      reader_.wrote(static_cast<size_t>(n));
      continue;
    }
    if (n == 0) return transport_error("the node closed the connection");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return ok_status();
    return transport_error(std::string("reading: ") + std::strerror(errno));
  }
}

Result<std::optional<RedisReply>> RedisConnection::next_reply() {
  if (broken_) return unavailable("redis " + endpoint_.text() + ": connection is broken");
  auto r = reader_.next();
  if (!r.ok()) return transport_error(r.status().message());
  return r;
}

Result<std::vector<RedisReply>> RedisConnection::receive(size_t n) {
  std::vector<RedisReply> out;
  out.reserve(n);
  const auto deadline = Clock::now() + timeouts_.io;
  while (out.size() < n) {
    KVTIER_ASSIGN_OR_RETURN(std::optional<RedisReply> r, next_reply());
    if (r) {
      out.push_back(std::move(*r));
      continue;
    }
    if (!net::wait_for(fd_.get(), POLLIN, deadline)) return transport_error("no reply in time");
    KVTIER_RETURN_IF_ERROR(read_available());
  }
  return out;
}

Result<std::vector<RedisReply>> RedisConnection::pipeline(std::span<const RedisCommand> commands) {
  KVTIER_RETURN_IF_ERROR(send(commands));
  return receive(commands.size());
}

Result<RedisReply> RedisConnection::command(const RedisCommand& cmd) {
  KVTIER_ASSIGN_OR_RETURN(std::vector<RedisReply> r, pipeline(std::span(&cmd, 1)));
  return std::move(r.front());
}

}  // namespace kvtier
