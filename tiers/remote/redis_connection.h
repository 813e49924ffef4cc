// RedisConnection: one blocking hiredis connection to one Redis node, owned (RAII), with
// pipelining: a batch of commands is written in one go and its replies read back in order, so a
// batch costs one round trip. Replies are kept as hiredis made them (no copy of a value).
// Not thread-safe: the cluster client guards each connection with a mutex.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "tiers/remote/redis_address.h"

struct redisContext;
struct redisReply;

namespace kvtier {

// One reply, owned. For a nested reply (CLUSTER SLOTS) `raw()` walks the tree.
class RedisReply {
 public:
  RedisReply() = default;
  explicit RedisReply(redisReply* r);
  RedisReply(RedisReply&&) noexcept = default;
  RedisReply& operator=(RedisReply&&) noexcept = default;

  bool is_nil() const;
  bool is_error() const;
  bool is_status() const;
  bool is_string() const;
  bool is_integer() const;
  long long integer() const;
  // The bytes of a string, status or error reply.
  std::string_view str() const;
  const redisReply* raw() const { return r_.get(); }

 private:
  struct Free {
    void operator()(redisReply* r) const;
  };
  std::unique_ptr<redisReply, Free> r_;
};

// A command as its arguments; binary-safe. The views must outlive the call that sends them.
using RedisCommand = std::vector<std::string_view>;

struct RedisTimeouts {
  std::chrono::milliseconds connect{500};
  std::chrono::milliseconds io{5000};  // one batch's write and read
};

class RedisConnection {
 public:
  // Connects and authenticates. kUnavailable when the node cannot be reached; kFailedPrecondition
  // when it refuses the credentials (a configuration error, not a passing fault).
  static Result<std::unique_ptr<RedisConnection>> open(const RedisEndpoint& endpoint, const std::string& user,
                                                       const std::string& password, RedisTimeouts timeouts);
  ~RedisConnection();
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  // Sends every command, then reads every reply, in order. A transport failure (reset, timeout)
  // is kUnavailable and leaves the connection unusable (broken() turns true); error replies are
  // replies, not failures.
  Result<std::vector<RedisReply>> pipeline(std::span<const RedisCommand> commands);
  // The two halves of pipeline(), so a client can start several nodes on their batches before
  // it waits for any: send() writes the commands out, receive() reads `n` replies.
  Status send(std::span<const RedisCommand> commands);
  Result<std::vector<RedisReply>> receive(size_t n);
  // For a client reading several nodes at once: the socket to poll, one read of what has arrived
  // (call when poll says readable), and the next complete reply if one has been read (nullopt
  // while it is still arriving).
  int fd() const;
  Status read_available();
  Result<std::optional<RedisReply>> next_reply();
  Result<RedisReply> command(const RedisCommand& command);
  bool broken() const { return broken_; }
  const RedisEndpoint& endpoint() const { return endpoint_; }

 private:
  RedisConnection(RedisEndpoint endpoint, redisContext* c) : endpoint_(std::move(endpoint)), c_(c) {}
  Status transport_error(const char* what);

  RedisEndpoint endpoint_;
  redisContext* c_ = nullptr;
  bool broken_ = false;
};

}  // namespace kvtier
