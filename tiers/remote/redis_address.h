// Where the remote tier's Redis lives, from kvtierd's --remote flag:
//   redis://[user:password@]host:port[,host:port...]
// Several host:port pairs are seeds of one Redis Cluster (any reachable one yields the slot map);
// a single one may also be a standalone Redis. A password without a user is `requirepass`'s
// (AUTH password); with a user, an ACL user's (AUTH user password).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace kvtier {

struct RedisEndpoint {
  std::string host;
  int port = 6379;
  std::string text() const { return host + ":" + std::to_string(port); }
  bool operator==(const RedisEndpoint&) const = default;
};

struct RedisAddress {
  std::string user;      // empty: the default user
  std::string password;  // empty: no AUTH
  std::vector<RedisEndpoint> seeds;

  static Result<RedisAddress> parse(std::string_view url);
  // The URL without the password, for logs and metrics.
  std::string redacted() const;
};

}  // namespace kvtier
