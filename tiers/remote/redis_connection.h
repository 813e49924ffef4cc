// RedisConnection: one blocking connection to one Redis node, owned (RAII), speaking RESP2 itself
// with pipelining: a batch of commands goes out in one gathered write (a SET's value is sent from
// where the block's frame lies, not copied into a command buffer) and its replies are read back in
// order, so a batch costs one round trip. Replies come from RespReader: a GET's value lands
// straight in the aligned buffer its block will keep. Not thread-safe: the cluster client guards
// each connection with a mutex.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "base/unique_fd.h"
#include "tiers/remote/redis_address.h"
#include "tiers/remote/resp/resp_reader.h"
#include "tiers/remote/resp/resp_reply.h"

namespace kvtier {

// A command as its arguments; binary-safe. The views must outlive the call that sends them.
using RedisCommand = std::vector<std::string_view>;

struct RedisTimeouts {
  std::chrono::milliseconds connect{500};
  std::chrono::milliseconds io{5000};  // one batch's write and read
};

class RedisConnection {
 public:
  // Connects and authenticates. kUnavailable when the node cannot be reached; kFailedPrecondition
  // when it refuses the credentials (a configuration error, not a passing fault). `reader` says
  // how replies are read (which strings get buffers of their own, what is checksummed).
  static Result<std::unique_ptr<RedisConnection>> open(const RedisEndpoint& endpoint, const std::string& user,
                                                       const std::string& password, RedisTimeouts timeouts,
                                                       RespReaderOptions reader = {});
  ~RedisConnection();
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  // Sends every command, then reads every reply, in order. A transport failure (reset, timeout,
  // bytes that are not RESP) is kUnavailable and leaves the connection unusable (broken() turns
  // true); error replies are replies, not failures.
  Result<std::vector<RedisReply>> pipeline(std::span<const RedisCommand> commands);
  // The two halves of pipeline(), so a client can start several nodes on their batches before
  // it waits for any: send() writes the commands out, receive() reads `n` replies.
  Status send(std::span<const RedisCommand> commands);
  Result<std::vector<RedisReply>> receive(size_t n);
  // For a client reading several nodes at once: the socket to poll, one read of what has arrived
  // (call when poll says readable), and the next complete reply if one has been read (nullopt
  // while it is still arriving).
  int fd() const { return fd_.get(); }
  Status read_available();
  Result<std::optional<RedisReply>> next_reply();
  Result<RedisReply> command(const RedisCommand& command);
  bool broken() const { return broken_; }
  const RedisEndpoint& endpoint() const { return endpoint_; }

 private:
  RedisConnection(RedisEndpoint endpoint, UniqueFd fd, RedisTimeouts timeouts, RespReaderOptions reader)
      : endpoint_(std::move(endpoint)), fd_(std::move(fd)), timeouts_(timeouts), reader_(std::move(reader)) {}
  Status transport_error(const std::string& what);

  RedisEndpoint endpoint_;
  UniqueFd fd_;
  RedisTimeouts timeouts_;
  RespReader reader_;
  std::string headers_;  // the RESP framing of the batch being sent
  bool broken_ = false;
};

}  // namespace kvtier
