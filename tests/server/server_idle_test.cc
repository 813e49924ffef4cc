// Idle connections must not starve working ones: 1,000 clients connect to the real kvtierd and
// send nothing while 32 others ask for /healthz and a block. With a fixed pool of 64 workers each
// idle connection held a worker until its keep-alive timeout ran out, so requests waited tens of
// seconds; with a thread per connection none waits for a worker, and an idle one sleeps in one
// poll() (cpp-httplib's own loop woke each every 10 ms, which on 2 cores put the p99 near 60 ms).
// The bound is the issue's: 50 ms p99. And a connection that never sends a request is closed
// after --idle-timeout, so it cannot hold its thread for ever.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <chrono>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>

#include "server/cli/kvtier_client.h"
#include "tests/server/server_process.h"
#include "tests/server/wire_blocks.h"
#include "tests/support/temp_dir.h"

namespace kvtier {
namespace {

// The server's gauge of connections being served, read over a connection of its own.
double open_connections(KvtierClient& client) {
  auto metrics = client.metrics();
  if (!metrics.ok()) return -1;
  const std::string open = "kvtier_http_connections_open ";
  const size_t at = metrics->find("\n" + open);
  return at == std::string::npos ? -1 : std::stod(metrics->substr(at + 1 + open.size()));
}

double p99(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, v.size() * 99 / 100)];
}

TEST(ServerIdleTest, AThousandIdleConnectionsDoNotStarveThirtyTwoWorkingClients) {
  rlimit lim{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &lim), 0);
  lim.rlim_cur = lim.rlim_max;
  setrlimit(RLIMIT_NOFILE, &lim);
  if (lim.rlim_max < 1200) GTEST_SKIP() << "this machine allows only " << lim.rlim_max << " open files";

  testing::TempDir dir;
  // A long idle timeout: on a loaded 2-core CI machine accepting the thousand took 4.6 s, and
  // the default 5 s closed the first of them before the end.
  testing::ServerProcess server((dir / "kvtierd.log").string(),
                                {"--layout", "tiny", "--log-level", "warn", "--idle-timeout", "300",
                                 "--max-connections-per-client", "2000"});
  ASSERT_GT(server.port(), 0) << server.log();
  const auto blocks = testing::prompt_blocks(testing::tiny_layout(DType::kBF16), "idle", testing::prompt(3, 16));
  KvtierClient setup("127.0.0.1", server.port());
  ASSERT_TRUE(setup.put(blocks[0].hash, blocks[0].document).ok());

  std::vector<int> idle;
  for (int i = 0; i < 1000; ++i) {
    const int fd = testing::connect_loopback(server.port());
    ASSERT_GE(fd, 0) << "connection " << i << ": " << std::strerror(errno);
    idle.push_back(fd);
  }
  // Measure once the server holds all of them (its accept queue drained), as a server under
  // attack would: new clients then arrive beside a thousand held connections.
  const auto accept_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  double held = 0;
  while ((held = open_connections(setup)) < 1000 && std::chrono::steady_clock::now() < accept_deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_GE(held, 1000) << server.log();

  // Each client connects and is answered once (the server is still starting threads for the
  // thousand), then all measure together, well inside the server's 5 s keep-alive timeout so
  // that the idle connections are all still open.
  std::mutex mu;
  std::vector<double> healthz_ms, get_ms, binary_get_ms, first_ms;
  int wrong = 0, failed = 0;
  std::atomic<int> ready{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < 32; ++c) {
    // Half fetch the block over HTTP, half over the binary port (its connection opened here).
    clients.emplace_back([&, binary = c % 2 == 1] {
      KvtierClient client("127.0.0.1", server.port());
      client.use_binary(binary);
      const auto c0 = std::chrono::steady_clock::now();
      const bool first_ok = client.healthz().ok() && client.binary_in_use() == binary && client.get(blocks[0].hash).ok();
      const double first = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - c0).count();
      ++ready;
      while (ready.load() < 32) std::this_thread::yield();
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
      std::vector<double> h, g;
      int bad = 0, errors = 0;
      while (std::chrono::steady_clock::now() < until) {
        auto t0 = std::chrono::steady_clock::now();
        errors += !client.healthz().ok();
        auto t1 = std::chrono::steady_clock::now();
        auto got = client.get(blocks[0].hash);
        auto t2 = std::chrono::steady_clock::now();
        if (!got.ok()) ++errors;
        else if (!(*got == blocks[0].document)) ++bad;
        h.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        g.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
      }
      std::lock_guard lock(mu);
      first_ms.push_back(first);
      failed += !first_ok;
      healthz_ms.insert(healthz_ms.end(), h.begin(), h.end());
      auto& gets = binary ? binary_get_ms : get_ms;
      gets.insert(gets.end(), g.begin(), g.end());
      wrong += bad;
      failed += errors;
    });
  }
  for (auto& t : clients) t.join();
  held = open_connections(setup);
  for (int fd : idle) ::close(fd);

  ASSERT_FALSE(healthz_ms.empty());
  ASSERT_FALSE(get_ms.empty());
  ASSERT_FALSE(binary_get_ms.empty());
  std::printf("first answer on a new connection: max %.2f ms\n", *std::max_element(first_ms.begin(), first_ms.end()));
  std::printf("%zu healthz p99 %.2f ms, %zu GET p99 %.2f ms, %zu binary GET p99 %.2f ms with 1000 idle connections "
              "(max %.2f / %.2f / %.2f)\n",
              healthz_ms.size(), p99(healthz_ms), get_ms.size(), p99(get_ms), binary_get_ms.size(), p99(binary_get_ms),
              *std::max_element(healthz_ms.begin(), healthz_ms.end()), *std::max_element(get_ms.begin(), get_ms.end()),
              *std::max_element(binary_get_ms.begin(), binary_get_ms.end()));
  EXPECT_EQ(failed, 0);
  EXPECT_EQ(wrong, 0);
  // A connection that waited for a worker would wait for --idle-timeout (300 s).
  EXPECT_LT(*std::max_element(first_ms.begin(), first_ms.end()), 5000.0) << "a new connection waited for a worker";
  // Starved requests would wait seconds; served ones take ~3 ms here (p99), ~45 ms under ASan on
  // this 2-core VM, where 50 ms failed when the test ran beside another (55 ms, ctest -j2).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  const double bound_ms = 200.0;
#else
  const double bound_ms = 50.0;
#endif
  EXPECT_LT(p99(healthz_ms), bound_ms);
  EXPECT_LT(p99(get_ms), bound_ms);
  EXPECT_LT(p99(binary_get_ms), bound_ms);
  // The idle ones are still held, each by its own thread.
  EXPECT_GE(held, 1000.0);
  EXPECT_EQ(server.stop(SIGTERM), 0) << server.log();
}

TEST(ServerIdleTest, AConnectionThatSendsNothingIsClosedAfterTheIdleTimeout) {
  testing::TempDir dir;
  testing::ServerProcess server((dir / "kvtierd.log").string(),
                                {"--layout", "tiny", "--log-level", "warn", "--idle-timeout", "1"});
  ASSERT_GT(server.port(), 0) << server.log();
  std::vector<int> idle;
  for (int i = 0; i < 20; ++i) {
    const int fd = testing::connect_loopback(server.port(), 10);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    idle.push_back(fd);
  }
  // Each is closed by the server: a read sees the end of the stream (0), not a timeout (-1).
  for (int fd : idle) {
    char byte;
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(::recv(fd, &byte, 1, 0), 0) << std::strerror(errno);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
    ::close(fd);
  }
  KvtierClient client("127.0.0.1", server.port());
  // Only the one asking, once every closing thread has also left: a connection's thread counts
  // it as served until just after the close the client saw (one was seen at 2 under load).
  const auto settle = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  double open = open_connections(client);
  while (open > 1.0 && std::chrono::steady_clock::now() < settle) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    open = open_connections(client);
  }
  EXPECT_LE(open, 1.0);
  auto m = client.metrics();
  ASSERT_TRUE(m.ok());
  EXPECT_NE(m->find("kvtier_http_idle_closed_total 20"), std::string::npos) << "each close is counted: " << *m;
  EXPECT_EQ(server.stop(SIGTERM), 0) << server.log();
}

TEST(ServerIdleTest, ShutdownDoesNotWaitForKeptAliveConnections) {
  testing::TempDir dir;
  testing::ServerProcess server((dir / "kvtierd.log").string(),
                                {"--layout", "tiny", "--log-level", "info", "--idle-timeout", "300"});
  ASSERT_GT(server.port(), 0) << server.log();
  KvtierClient client("127.0.0.1", server.port());
  ASSERT_TRUE(client.healthz().ok());  // its connection stays open, waiting for a next request
  const int silent = testing::connect_loopback(server.port());
  ASSERT_GE(silent, 0);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(server.stop(SIGTERM), 0) << server.log();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10)) << server.log();
  EXPECT_NE(server.log().find("connections still open"), std::string::npos) << server.log();
  ::close(silent);
}

}  // namespace
}  // namespace kvtier
