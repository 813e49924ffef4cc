// RedisServers: real redis-server processes on free loopback ports for the remote tier's tests —
// a Redis Cluster (masters with replicas, joined with `redis-cli --cluster create`, waited for
// until every node says cluster_state:ok) or one standalone server (for auth). Everything it
// started is killed when it goes, whatever the test did. The programs are Debian's, or those named
// by $KVTIER_REDIS_SERVER and $KVTIER_REDIS_CLI.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace kvtier::testing {

class RedisServers {
 public:
  // nullptr on failure, with the reason in *error (the servers' logs are in `dir`).
  static std::unique_ptr<RedisServers> cluster(const std::string& dir, int masters, int replicas_per_master,
                                               std::string* error);
  // On `port`, or a free one when 0.
  static std::unique_ptr<RedisServers> standalone(const std::string& dir, std::vector<std::string> extra_args,
                                                  std::string* error, int port = 0);
  ~RedisServers();

  // redis://[user:password@]127.0.0.1:p1,127.0.0.1:p2,...
  std::string url(const std::string& user = "", const std::string& password = "") const;
  const std::vector<int>& ports() const { return ports_; }
  // The port of the master serving `key`'s slot now (asked of the cluster).
  int master_port_for(const std::string& key) const;
  // SIGKILL the server on `port` (and forget it).
  void kill_port(int port);
  // Waits until every live node reports cluster_state:ok and no slot is served by a dead one.
  bool wait_cluster_ok(std::chrono::milliseconds timeout) const;
  // Waits until every replica of the master on `port` has acknowledged its whole replication
  // stream (Redis replicates asynchronously: a write the master acknowledged moments before it
  // dies can die with it).
  bool wait_replicated(int port, std::chrono::milliseconds timeout) const;
  // redis-cli -p PORT args..., its output.
  std::string cli(int port, const std::vector<std::string>& args) const;

 private:
  RedisServers(std::string dir) : dir_(std::move(dir)) {}
  bool start(int port, std::vector<std::string> args, std::string* error);

  std::string dir_;
  std::vector<int> ports_;
  std::vector<pid_t> pids_;
};

}  // namespace kvtier::testing
