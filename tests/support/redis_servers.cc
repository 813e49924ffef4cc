#include "tests/support/redis_servers.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <sstream>
#include <thread>

#include "tests/support/child_process.h"
#include "tiers/remote/redis_connection.h"

namespace kvtier::testing {
namespace {

// Debian's programs, unless the environment names others (a bundle carried to another machine).
std::string program(const char* env, const char* fallback) {
  const char* v = std::getenv(env);
  return v && *v ? v : fallback;
}

bool bindable(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  close(fd);
  return ok;
}

// A port whose cluster bus port (+10000) is free too.
int free_port(const std::vector<int>& taken) {
  static std::mt19937 rng(std::random_device{}());
  for (int tries = 0; tries < 1000; ++tries) {
    const int p = 20000 + static_cast<int>(rng() % 10000);
    if (std::find(taken.begin(), taken.end(), p) == taken.end() && bindable(p) && bindable(p + 10000)) return p;
  }
  return 0;
}

std::unique_ptr<RedisConnection> connect_to(int port) {
  auto c = RedisConnection::open({"127.0.0.1", port}, "", "", {std::chrono::milliseconds(200), std::chrono::seconds(5)});
  return c.ok() ? std::move(c).value() : nullptr;
}

std::string ask(int port, const RedisCommand& cmd) {
  auto c = connect_to(port);
  if (!c) return "";
  auto r = c->command(cmd);
  return r.ok() ? std::string(r->str()) : "";
}

}  // namespace

bool RedisServers::start(int port, std::vector<std::string> args, std::string* error) {
  std::vector<std::string> argv{program("KVTIER_REDIS_SERVER", "/usr/bin/redis-server"), "--port", std::to_string(port), "--bind", "127.0.0.1",
                                "--dir", dir_, "--save", "", "--appendonly", "no", "--daemonize", "no"};
  argv.insert(argv.end(), args.begin(), args.end());
  const pid_t pid = spawn_process(argv, dir_ + "/redis-" + std::to_string(port) + ".log");
  ports_.push_back(port);
  pids_.push_back(pid);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    // Anything that answers, even NOAUTH, is up.
    if (auto c = connect_to(port)) {
      if (c->command({"PING"}).ok()) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  *error = "redis-server on port " + std::to_string(port) + " did not start: " +
           read_file(dir_ + "/redis-" + std::to_string(port) + ".log");
  return false;
}

std::unique_ptr<RedisServers> RedisServers::cluster(const std::string& dir, int masters, int replicas,
                                                    std::string* error) {
  std::unique_ptr<RedisServers> s(new RedisServers(dir));
  const int n = masters * (1 + replicas);
  for (int i = 0; i < n; ++i) {
    const int port = free_port(s->ports_);
    // Full coverage off: when a master dies, the other slots keep serving while its replica
    // takes over, which is what the failover test observes.
    if (port == 0 || !s->start(port, {"--cluster-enabled", "yes", "--cluster-config-file",
                                      dir + "/nodes-" + std::to_string(port) + ".conf",
                                      "--cluster-node-timeout", "1000", "--cluster-require-full-coverage", "no",
                                      // Replicas sync at once (the default waits 5 s for others):
                                      // one that never synced cannot take over.
                                      "--repl-diskless-sync-delay", "0"},
                               error)) {
      if (port == 0) *error = "no free port pair";
      return nullptr;
    }
  }
  std::vector<std::string> create{"--cluster", "create"};
  for (int p : s->ports_) create.push_back("127.0.0.1:" + std::to_string(p));
  create.insert(create.end(), {"--cluster-replicas", std::to_string(replicas), "--cluster-yes"});
  const std::string out = s->cli(s->ports_.front(), create);
  if (out.find("[OK] All 16384 slots covered") == std::string::npos) {
    *error = "redis-cli --cluster create failed: " + out;
    return nullptr;
  }
  if (!s->wait_cluster_ok(std::chrono::seconds(30))) {
    *error = "the cluster did not reach cluster_state:ok";
    return nullptr;
  }
  // Every replica in sync with its master, so a failover test can count on it.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (int port : s->ports_) {
    while (true) {
      const std::string info = ask(port, {"INFO", "replication"});
      if (info.find("role:master") != std::string::npos || info.find("master_link_status:up") != std::string::npos) break;
      if (std::chrono::steady_clock::now() > deadline) {
        *error = "replica " + std::to_string(port) + " never synced with its master";
        return nullptr;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  return s;
}

std::unique_ptr<RedisServers> RedisServers::standalone(const std::string& dir, std::vector<std::string> extra,
                                                       std::string* error, int port) {
  std::unique_ptr<RedisServers> s(new RedisServers(dir));
  if (port == 0) port = free_port({});
  if (port == 0 || !s->start(port, std::move(extra), error)) return nullptr;
  return s;
}

RedisServers::~RedisServers() {
  for (pid_t pid : pids_) {
    if (pid > 0) kill(pid, SIGKILL);
  }
  for (pid_t pid : pids_) {
    if (pid > 0) waitpid(pid, nullptr, 0);
  }
}

std::string RedisServers::url(const std::string& user, const std::string& password) const {
  std::string u = "redis://";
  if (!password.empty()) u += user + ":" + password + "@";
  for (size_t i = 0; i < ports_.size(); ++i) u += (i ? ",127.0.0.1:" : "127.0.0.1:") + std::to_string(ports_[i]);
  return u;
}

std::string RedisServers::cli(int port, const std::vector<std::string>& args) const {
  std::vector<std::string> argv{program("KVTIER_REDIS_CLI", "/usr/bin/redis-cli"), "-p", std::to_string(port)};
  argv.insert(argv.end(), args.begin(), args.end());
  const std::string log = dir_ + "/redis-cli.out";
  ::unlink(log.c_str());
  const pid_t pid = spawn_process(argv, log);
  int status = 0;
  waitpid(pid, &status, 0);
  return read_file(log);
}

int RedisServers::master_port_for(const std::string& key) const {
  for (int port : ports_) {
    auto c = connect_to(port);
    if (!c) continue;
    auto slot = c->command({"CLUSTER", "KEYSLOT", key});
    auto slots = c->command({"CLUSTER", "SLOTS"});
    if (!slot.ok() || !slots.ok() || !slots->is_array()) continue;
    for (const RedisReply& e : slots->elements()) {
      const auto& f = e.elements();
      if (slot->integer() >= f[0].integer() && slot->integer() <= f[1].integer()) {
        return static_cast<int>(f[2].elements()[1].integer());
      }
    }
  }
  return 0;
}

void RedisServers::kill_port(int port) {
  for (size_t i = 0; i < ports_.size(); ++i) {
    if (ports_[i] == port && pids_[i] > 0) {
      kill(pids_[i], SIGKILL);
      waitpid(pids_[i], nullptr, 0);
      pids_[i] = -1;
    }
  }
}

bool RedisServers::wait_replicated(int port, std::chrono::milliseconds timeout) const {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    // INFO replication: "master_repl_offset:N" and a "slaveI:ip=...,offset=N,..." line per replica.
    const std::string info = ask(port, {"INFO", "replication"});
    long long master = -1;
    std::vector<long long> replicas;
    std::istringstream lines(info);
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("master_repl_offset:", 0) == 0) master = std::atoll(line.c_str() + 19);
      const size_t at = line.find(",offset=");
      if (line.rfind("slave", 0) == 0 && at != std::string::npos) replicas.push_back(std::atoll(line.c_str() + at + 8));
    }
    if (master >= 0 && !replicas.empty() &&
        std::all_of(replicas.begin(), replicas.end(), [&](long long r) { return r >= master; })) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

bool RedisServers::wait_cluster_ok(std::chrono::milliseconds timeout) const {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    bool ok = true;
    std::vector<int> live;
    for (size_t i = 0; i < ports_.size(); ++i) {
      if (pids_[i] > 0) live.push_back(ports_[i]);
    }
    for (int port : live) {
      if (ask(port, {"CLUSTER", "INFO"}).find("cluster_state:ok") == std::string::npos) ok = false;
    }
    // Every slot served by a live master.
    if (ok) {
      auto c = connect_to(live.front());
      auto slots = c ? c->command({"CLUSTER", "SLOTS"}) : Result<RedisReply>(unavailable("no connection"));
      long long covered = 0;
      if (slots.ok() && slots->is_array()) {
        for (const RedisReply& e : slots->elements()) {
          const auto& f = e.elements();
          const int port = static_cast<int>(f[2].elements()[1].integer());
          if (std::find(live.begin(), live.end(), port) != live.end()) {
            covered += f[1].integer() - f[0].integer() + 1;
          }
        }
      }
      ok = covered == 16384;
    }
    if (ok) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

}  // namespace kvtier::testing
