// Two kvtierd hosts sharing a real Redis Cluster (3 masters, 3 replicas on loopback): what one
// stores the other serves bit for bit, a corrupt value is a counted miss, Redis down or failing
// over is a miss and never an error or wrong bytes, and a wrong password stops kvtierd at start.
// The tests share one cluster (one CTest test); the failover tests, which change it, are defined
// last: gtest runs a suite's tests in the order they are defined (CTest runs this binary whole).
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>

#include "server/cli/kvtier_client.h"
#include "tests/server/raw_requests.h"
#include "tests/server/server_process.h"
#include "tests/server/wire_blocks.h"
#include "tests/support/redis_servers.h"
#include "tests/support/temp_dir.h"
#include "tiers/remote/redis_cluster.h"

namespace kvtier {
namespace {

using testing::RedisServers;
using testing::ServerProcess;
using testing::TempDir;

struct Shared {
  TempDir dir;
  std::unique_ptr<RedisServers> redis;
};

Shared& shared() {
  static Shared* s = [] {
    auto* sh = new Shared();
    std::string error;
    sh->redis = RedisServers::cluster(sh->dir.str(), 3, 1, &error);
    EXPECT_TRUE(sh->redis) << error;
    return sh;
  }();
  return *s;
}

class ServerRemoteTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(shared().redis) << "no Redis Cluster"; }

  std::unique_ptr<ServerProcess> host(const std::string& name, DType dtype, const std::string& url,
                                      std::vector<std::string> extra = {}) {
    std::vector<std::string> args{"--layout", testing::write_layout_file(dir_.str(), dtype), "--remote", url,
                                  "--ram-capacity", "64K", "--log-level", "warn"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto p = std::make_unique<ServerProcess>((dir_ / (name + ".log")).string(), args);
    EXPECT_GT(p->port(), 0) << p->log();
    return p;
  }

  static double metric(KvtierClient& c, const std::string& name, const std::string& label_key = "",
                       const std::string& label_value = "") {
    return testing::metric_value(c, name, label_key, label_value);
  }

  // Waits until `c`'s remote writer has written `n` blocks.
  static bool written(KvtierClient& c, double n) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
    while (std::chrono::steady_clock::now() < deadline) {
      if (metric(c, "kvtier_remote_written_blocks_total") >= n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  TempDir dir_;
};

TEST_F(ServerRemoteTest, ABlockStoredOnOneHostIsABitExactHitOnAnotherForEveryDtype) {
  const std::string url = shared().redis->url();
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    const std::string d(dtype_name(dtype));
    auto a = host("a-" + d, dtype, url), b = host("b-" + d, dtype, url);
    KvtierClient ca("127.0.0.1", a->port()), cb("127.0.0.1", b->port());
    const auto tokens = testing::prompt(100 + static_cast<uint32_t>(dtype), 16 * 8);
    const auto blocks = testing::prompt_blocks(testing::tiny_layout(dtype), "shared", tokens);
    for (const auto& w : blocks) {
      auto put = ca.put(w.hash, w.document);
      ASSERT_TRUE(put.ok() && *put) << put.status().to_string();
    }
    ASSERT_TRUE(written(ca, 8));
    auto seen = cb.lookup("shared", tokens);
    ASSERT_TRUE(seen.ok()) << seen.status().to_string();
    EXPECT_EQ((*seen)["matched_tokens"], 128) << "B's lookup sees A's prefix";
    for (const auto& blk : (*seen)["blocks"]) EXPECT_EQ(blk["tier"], "remote");
    for (const auto& w : blocks) {
      auto got = cb.get(w.hash);
      ASSERT_TRUE(got.ok()) << got.status().to_string();
      EXPECT_TRUE(std::equal(got->begin(), got->end(), w.document.begin(), w.document.end()));
    }
    EXPECT_EQ(metric(cb, "kvtier_remote_reads_total", "outcome", "hit"), 8);
  }
}

TEST_F(ServerRemoteTest, AGarbageValueIsAMissCountedAndDeleted) {
  const std::string url = shared().redis->url();
  auto a = host("garbage-a", DType::kBF16, url), b = host("garbage-b", DType::kBF16, url);
  KvtierClient ca("127.0.0.1", a->port()), cb("127.0.0.1", b->port());
  const auto blocks = testing::prompt_blocks(testing::tiny_layout(DType::kBF16), "shared", testing::prompt(200, 32));
  for (const auto& w : blocks) ASSERT_TRUE(ca.put(w.hash, w.document).value());
  ASSERT_TRUE(written(ca, 2));
  RedisClusterOptions o;
  o.address = *RedisAddress::parse(url);
  auto redis = RedisCluster::open(o);
  ASSERT_TRUE(redis.ok());
  const std::string key = "kvtier:" + blocks[1].hash.hex();
  auto r = (*redis)->execute(std::vector<RedisCommand>{{"SET", key, "not a block at all"}});
  ASSERT_TRUE(r.front().ok() && r.front()->is_status());
  EXPECT_TRUE(cb.get(blocks[0].hash).ok());
  auto miss = cb.get(blocks[1].hash);
  EXPECT_EQ(miss.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(metric(cb, "kvtier_remote_reads_total", "outcome", "corrupt"), 1);
  auto gone = (*redis)->execute(std::vector<RedisCommand>{{"EXISTS", key}});
  EXPECT_EQ(gone.front()->integer(), 0) << "the garbage was deleted";
  // docs/metrics.md lists the remote tier's families too.
  auto text = cb.metrics();
  ASSERT_TRUE(text.ok());
  std::ifstream in(std::string(KVTIER_SOURCE_DIR) + "/docs/metrics.md");
  const std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream lines(*text);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("# TYPE kvtier_remote_", 0) != 0) continue;
    const std::string name = line.substr(7, line.find(' ', 7) - 7);
    EXPECT_NE(doc.find("`" + name + "`"), std::string::npos) << name << " is not in docs/metrics.md";
  }
}

TEST_F(ServerRemoteTest, BothHostsRestartAndStillHit) {
  const std::string url = shared().redis->url();
  const auto blocks = testing::prompt_blocks(testing::tiny_layout(DType::kF16), "shared", testing::prompt(300, 64));
  {
    auto a = host("restart-a", DType::kF16, url);
    {
      KvtierClient ca("127.0.0.1", a->port());
      for (const auto& w : blocks) ASSERT_TRUE(ca.put(w.hash, w.document).value());
    }
    EXPECT_EQ(a->stop(SIGTERM), 0);  // drains its remote writer
  }
  auto a = host("restart-a2", DType::kF16, url), b = host("restart-b2", DType::kF16, url);
  for (int port : {a->port(), b->port()}) {
    KvtierClient c("127.0.0.1", port);
    for (const auto& w : blocks) {
      auto got = c.get(w.hash);
      ASSERT_TRUE(got.ok()) << got.status().to_string();
      EXPECT_TRUE(std::equal(got->begin(), got->end(), w.document.begin(), w.document.end()));
    }
  }
}

TEST_F(ServerRemoteTest, RedisDownAtStartServesLocalTiersAndCounts) {
  std::string error;
  auto probe = RedisServers::standalone(dir_.str(), {}, &error);
  ASSERT_TRUE(probe) << error;
  const std::string dead = probe->url();
  probe.reset();
  auto a = host("down", DType::kBF16, dead, {"--ram-capacity", "16M"});
  ASSERT_GT(a->port(), 0);
  auto client = std::make_unique<KvtierClient>("127.0.0.1", a->port());
  KvtierClient& ca = *client;
  const auto blocks = testing::prompt_blocks(testing::tiny_layout(DType::kBF16), "local", testing::prompt(400, 32));
  for (const auto& w : blocks) ASSERT_TRUE(ca.put(w.hash, w.document).value());
  for (const auto& w : blocks) EXPECT_TRUE(ca.get(w.hash).ok()) << "served from RAM";
  EXPECT_EQ((*ca.lookup("local", testing::prompt(400, 32)))["matched_tokens"], 32);
  EXPECT_EQ((*ca.lookup("local", testing::prompt(401, 32)))["matched_tokens"], 0) << "a miss, not an error";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (metric(ca, "kvtier_remote_write_failures_total") < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_GE(metric(ca, "kvtier_remote_write_failures_total"), 2);
  EXPECT_EQ(metric(ca, "kvtier_remote_retry_blocks"), 2) << "failed writes wait for a retry, not dropped";
  EXPECT_GE(metric(ca, "kvtier_remote_lookup_errors_total"), 1);
  client.reset();  // an open keep-alive connection would hold the shutdown for its read timeout
  EXPECT_EQ(a->stop(SIGTERM), 0);
  EXPECT_NE(a->log().find("no node of redis://"), std::string::npos) << a->log();
}

TEST_F(ServerRemoteTest, AWrongPasswordIsAClearStartUpError) {
  std::string error;
  auto redis = RedisServers::standalone(dir_.str(), {"--requirepass", "sekret"}, &error);
  ASSERT_TRUE(redis) << error;
  ServerProcess ok((dir_ / "auth-ok.log").string(),
                   {"--layout", "tiny", "--remote", redis->url("", "sekret"), "--log-level", "warn"});
  EXPECT_GT(ok.port(), 0) << ok.log();
  ServerProcess bad((dir_ / "auth-bad.log").string(),
                    {"--layout", "tiny", "--remote", redis->url("", "wrong"), "--log-level", "warn"});
  EXPECT_EQ(bad.port(), 0);
  EXPECT_NE(bad.log().find("refused the credentials"), std::string::npos) << bad.log();
}

// Defined after every test that needs all masters up: it kills one.
TEST_F(ServerRemoteTest, KillingAMasterUnderLoadServesNoWrongBytesAndHitsResumeAfterFailover) {
  RedisServers& redis = *shared().redis;
  const std::string url = redis.url();
  auto a = host("load-a", DType::kBF16, url), b = host("load-b", DType::kBF16, url);
  KvtierClient ca("127.0.0.1", a->port());
  const auto blocks = testing::prompt_blocks(testing::tiny_layout(DType::kBF16), "load", testing::prompt(500, 16 * 48));
  for (const auto& w : blocks) ASSERT_TRUE(ca.put(w.hash, w.document).value());
  ASSERT_TRUE(written(ca, 48));

  std::atomic<bool> stop{false};
  std::atomic<int> hits{0}, misses{0}, wrong{0}, errors{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < 8; ++t) {
    clients.emplace_back([&, t] {
      KvtierClient c("127.0.0.1", b->port());
      std::mt19937 rng(t);
      while (!stop) {
        const auto& w = blocks[rng() % blocks.size()];
        auto got = c.get(w.hash);
        if (got.ok()) {
          if (std::equal(got->begin(), got->end(), w.document.begin(), w.document.end())) ++hits;
          else ++wrong;
        } else if (got.status().code() == StatusCode::kNotFound) {
          ++misses;
        } else {
          ++errors;  // a 5xx or a transport error
        }
      }
    });
  }
  // The load is running: every client has been served before the kill.
  const auto loaded = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (hits + misses + wrong + errors < 8 * 20 && std::chrono::steady_clock::now() < loaded) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const int victim = redis.master_port_for("kvtier:" + blocks[0].hash.hex());
  ASSERT_GT(victim, 0);
  // Redis replicates asynchronously, so a block could die with its master unreplicated (seen once
  // on a loaded CI machine: 47 of 48 came back). That is Redis's contract, not kvtier's; what this
  // test holds kvtier to is what happens around a failover of replicated data.
  ASSERT_TRUE(redis.wait_replicated(victim, std::chrono::seconds(10)))
      << redis.cli(victim, {"INFO", "replication"});
  redis.kill_port(victim);
  const bool recovered = redis.wait_cluster_ok(std::chrono::seconds(30));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  stop = true;
  for (auto& th : clients) th.join();
  ASSERT_TRUE(recovered) << "the replica never took over:\n"
                         << redis.cli(redis.ports()[redis.ports()[0] == victim ? 1 : 0], {"CLUSTER", "NODES"});
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(errors.load(), 0);
  EXPECT_GT(hits.load(), 0);
  EXPECT_GT(misses.load(), 0) << "the dead master's blocks were asked for while it was down";
  // After the failover every block is a hit again (a replica holds what its master had; blocks
  // this host cached in RAM meanwhile count too).
  KvtierClient c("127.0.0.1", b->port());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  size_t served = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    served = 0;
    for (const auto& w : blocks) served += c.get(w.hash).ok();
    if (served == blocks.size()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_EQ(served, blocks.size());
}

// After the master kill above: a prefix stored on one host while a master is down (its SETs to
// that master fail) is seen whole by another host once a replica took over, because the failed
// writes are retried while the first host still holds the blocks.
TEST_F(ServerRemoteTest, APrefixStoredDuringAnOutageIsSharedAfterRecovery) {
  RedisServers& redis = *shared().redis;
  const std::string url = redis.url();
  auto a = host("outage-a", DType::kBF16, url, {"--ram-capacity", "4M"});
  auto b = host("outage-b", DType::kBF16, url);
  KvtierClient ca("127.0.0.1", a->port()), cb("127.0.0.1", b->port());
  const auto tokens = testing::prompt(600, 256);
  const auto blocks = testing::prompt_blocks(testing::tiny_layout(DType::kBF16), "outage", tokens);
  // A master that has a replica to take over (the one killed above has none left).
  int victim = 0;
  for (int port : redis.ports()) {
    const std::string info = redis.cli(port, {"INFO", "replication"});
    if (info.find("role:master") != std::string::npos && info.find("connected_slaves:1") != std::string::npos) {
      victim = port;
      break;
    }
  }
  ASSERT_GT(victim, 0);
  redis.kill_port(victim);
  for (const auto& w : blocks) ASSERT_TRUE(ca.put(w.hash, w.document).value());
  const auto failed_by = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (metric(ca, "kvtier_remote_write_failures_total") < 1 && std::chrono::steady_clock::now() < failed_by) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GE(metric(ca, "kvtier_remote_write_failures_total"), 1) << "some SETs went to the dead master";
  ASSERT_TRUE(redis.wait_cluster_ok(std::chrono::seconds(30)));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  size_t matched = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    auto r = cb.lookup("outage", tokens);
    matched = r.ok() ? (*r)["matched_tokens"].get<size_t>() : 0;
    if (matched == tokens.size()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_EQ(matched, tokens.size()) << a->log();
  for (const auto& w : blocks) {
    auto got = cb.get(w.hash);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_TRUE(std::equal(got->begin(), got->end(), w.document.begin(), w.document.end()));
  }
  EXPECT_GE(metric(ca, "kvtier_remote_retried_written_total"), 1);
}

}  // namespace
}  // namespace kvtier
