#include "tiers/remote/redis_connection.h"

#include <hiredis/hiredis.h>
#include <sys/ioctl.h>

namespace kvtier {
namespace {

timeval to_timeval(std::chrono::milliseconds ms) {
  return {static_cast<time_t>(ms.count() / 1000), static_cast<suseconds_t>((ms.count() % 1000) * 1000)};
}

}  // namespace

RedisReply::RedisReply(redisReply* r) : r_(r) {}
void RedisReply::Free::operator()(redisReply* r) const { freeReplyObject(r); }
bool RedisReply::is_nil() const { return !r_ || r_->type == REDIS_REPLY_NIL; }
bool RedisReply::is_error() const { return r_ && r_->type == REDIS_REPLY_ERROR; }
bool RedisReply::is_status() const { return r_ && r_->type == REDIS_REPLY_STATUS; }
bool RedisReply::is_string() const { return r_ && r_->type == REDIS_REPLY_STRING; }
bool RedisReply::is_integer() const { return r_ && r_->type == REDIS_REPLY_INTEGER; }
long long RedisReply::integer() const { return r_ ? r_->integer : 0; }
std::string_view RedisReply::str() const {
  return r_ && r_->str ? std::string_view(r_->str, r_->len) : std::string_view();
}

Result<std::unique_ptr<RedisConnection>> RedisConnection::open(const RedisEndpoint& e, const std::string& user,
                                                               const std::string& password,
                                                               RedisTimeouts timeouts) {
  redisContext* c = redisConnectWithTimeout(e.host.c_str(), e.port, to_timeval(timeouts.connect));
  if (c == nullptr) return unavailable("redis " + e.text() + ": out of memory for a connection");
  if (c->err) {
    Status st = unavailable("redis " + e.text() + ": " + c->errstr);
    redisFree(c);
    return st;
  }
  std::unique_ptr<RedisConnection> conn(new RedisConnection(e, c));
  redisSetTimeout(c, to_timeval(timeouts.io));
  redisEnableKeepAlive(c);
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

RedisConnection::~RedisConnection() {
  if (c_) redisFree(c_);
}

Status RedisConnection::transport_error(const char* what) {
  broken_ = true;
  return unavailable("redis " + endpoint_.text() + ": " + what + ": " + (c_->errstr[0] ? c_->errstr : "closed"));
}

Status RedisConnection::send(std::span<const RedisCommand> commands) {
  if (broken_) return unavailable("redis " + endpoint_.text() + ": connection is broken");
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (const RedisCommand& cmd : commands) {
    argv.clear();
    lens.clear();
    for (std::string_view a : cmd) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    if (redisAppendCommandArgv(c_, static_cast<int>(argv.size()), argv.data(), lens.data()) != REDIS_OK) {
      return transport_error("queueing a command");
    }
  }
  int done = 0;
  while (!done) {
    if (redisBufferWrite(c_, &done) != REDIS_OK) return transport_error("writing");
  }
  return ok_status();
}

Result<std::vector<RedisReply>> RedisConnection::receive(size_t n) {
  if (broken_) return unavailable("redis " + endpoint_.text() + ": connection is broken");
  std::vector<RedisReply> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    void* r = nullptr;
    if (redisGetReply(c_, &r) != REDIS_OK || r == nullptr) return transport_error("reading a reply");
    out.emplace_back(static_cast<redisReply*>(r));
  }
  return out;
}

int RedisConnection::fd() const { return c_->fd; }

Status RedisConnection::read_available() {
  if (broken_) return unavailable("redis " + endpoint_.text() + ": connection is broken");
  // Drain what the socket holds, not one 16 KiB read (hiredis's unit): a socket left full closes
  // its TCP window, and the node stalls until the client comes back to it.
  int pending = 0;
  do {
    if (redisBufferRead(c_) != REDIS_OK) return transport_error("reading");
  } while (::ioctl(c_->fd, FIONREAD, &pending) == 0 && pending > 0);
  return ok_status();
}

Result<std::optional<RedisReply>> RedisConnection::next_reply() {
  if (broken_) return unavailable("redis " + endpoint_.text() + ": connection is broken");
  void* r = nullptr;
  if (redisGetReplyFromReader(c_, &r) != REDIS_OK) return transport_error("parsing a reply");
  if (r == nullptr) return std::optional<RedisReply>();
  return std::optional<RedisReply>(RedisReply(static_cast<redisReply*>(r)));
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
