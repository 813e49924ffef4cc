// The HTTP port's connection limits on the real kvtierd, driven over raw sockets: a cap of
// connections per client address (the one past it is told why in a 503), and deadlines over a
// whole request, so a client that trickles a header or a body a byte at a time, or opens a TLS
// connection and never shakes hands, loses its connection instead of holding a thread.
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include "server/cli/kvtier_client.h"
#include "tests/server/server_process.h"
#include "tests/server/wire_blocks.h"
#include "tests/support/self_signed_cert.h"
#include "tests/support/temp_dir.h"

namespace kvtier {
namespace {

using Clock = std::chrono::steady_clock;
using testing::ServerProcess;

// Sends `request` and reads one response whose body has a Content-Length; "" when the
// connection closed first.
std::string exchange(int fd, const std::string& request) {
  if (!request.empty() && ::send(fd, request.data(), request.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(request.size())) {
    return "";
  }
  std::string got;
  char buf[4096];
  for (;;) {
    const size_t end = got.find("\r\n\r\n");
    if (end != std::string::npos) {
      const size_t at = got.find("Content-Length: ");
      const size_t length = at == std::string::npos ? 0 : std::stoul(got.substr(at + 16));
      if (got.size() >= end + 4 + length) return got;
    }
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return "";
    got.append(buf, static_cast<size_t>(n));
  }
}

const std::string kHealthz = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";

// How long until the server closes `fd` (reading and dropping what it sends).
Clock::duration until_closed(int fd) {
  const auto t0 = Clock::now();
  char buf[256];
  while (::recv(fd, buf, sizeof(buf), 0) > 0) {
  }
  return Clock::now() - t0;
}

class ServerHttpConnectionTest : public testing::ServerFixture {
 protected:
  static std::string metrics(int port, testing::CertFiles* tls = nullptr) {
    KvtierClient c("127.0.0.1", port, "", tls ? ClientTls{true, tls->cert} : ClientTls{});
    auto m = c.metrics();
    return m.ok() ? *m : m.status().to_string();
  }
};

TEST_F(ServerHttpConnectionTest, AClientPastItsConnectionCapGetsA503AndOthersDoNot) {
  auto server = start({"--max-connections-per-client", "3"});
  std::vector<int> held;
  for (int i = 0; i < 3; ++i) {
    held.push_back(testing::connect_loopback(server->port(), 10));
    ASSERT_NE(exchange(held.back(), kHealthz).find("200 OK"), std::string::npos);
  }
  const int fourth = testing::connect_loopback(server->port(), 10);
  const std::string refused = exchange(fourth, kHealthz);
  EXPECT_NE(refused.find("HTTP/1.1 503"), std::string::npos) << refused;
  EXPECT_NE(refused.find("too many connections from 127.0.0.1"), std::string::npos) << refused;
  ::close(fourth);
  // The held ones are still served, on their kept-alive connections.
  for (int fd : held) EXPECT_NE(exchange(fd, kHealthz).find("200 OK"), std::string::npos);
  ::close(held.back());  // one closes: its place is free again
  held.pop_back();
  bool served = false;
  for (int attempt = 0; attempt < 50 && !served; ++attempt) {
    const int again = testing::connect_loopback(server->port(), 10);
    served = exchange(again, kHealthz).find("200 OK") != std::string::npos;
    ::close(again);
    if (!served) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(served) << "the freed place was never given back";
  for (int fd : held) ::close(fd);
  std::string m;
  const std::string refusals = "kvtier_http_connections_refused_total{reason=\"per_client_cap\"} ";
  for (int attempt = 0; attempt < 50; ++attempt) {  // the closes reach the server in their own time
    m = metrics(server->port());
    if (m.find(refusals) != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // The fourth, and any retry above that came before the server saw the close.
  const size_t at = m.find(refusals);
  ASSERT_NE(at, std::string::npos) << m;
  EXPECT_GE(std::stoi(m.substr(at + refusals.size())), 1) << m;
  EXPECT_EQ(server->stop(SIGTERM), 0) << server->log();
}

// A per-read timeout does not stop a client that sends a byte now and then; the deadline is over
// the whole request.
TEST_F(ServerHttpConnectionTest, ATrickledHeaderOrBodyIsClosedAtTheRequestDeadline) {
  auto server = start({"--request-timeout", "1", "--idle-timeout", "10"});
  const int slow_header = testing::connect_loopback(server->port(), 10);
  std::thread trickle([&] {
    for (char c : std::string("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Padding: aaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n")) {
      if (::send(slow_header, &c, 1, MSG_NOSIGNAL) != 1) return;  // closed by the server: done
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  const auto header_closed = until_closed(slow_header);
  trickle.join();
  EXPECT_GT(header_closed, std::chrono::milliseconds(900));
  EXPECT_LT(header_closed, std::chrono::seconds(4)) << "a trickled header outlived --request-timeout 1";

  const auto blocks = testing::prompt_blocks(testing::tiny_layout(DType::kBF16), "m", testing::prompt(8, 16));
  const int slow_body = testing::connect_loopback(server->port(), 10);
  const std::string head = "PUT /v1/blocks/" + blocks[0].hash.hex() + "?namespace=m HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                           std::to_string(blocks[0].document.size()) + "\r\n\r\n";
  ASSERT_EQ(::send(slow_body, head.data(), head.size(), 0), static_cast<ssize_t>(head.size()));
  ASSERT_EQ(::send(slow_body, blocks[0].document.data(), 100, 0), 100);  // and never the rest
  const std::string answer = exchange(slow_body, "");
  EXPECT_EQ(until_closed(slow_body) < std::chrono::seconds(4), true);
  ::close(slow_header);
  ::close(slow_body);

  KvtierClient c("127.0.0.1", server->port());
  c.use_binary(false);
  EXPECT_EQ(c.get(blocks[0].hash, "m").status().code(), StatusCode::kNotFound) << "nothing half-stored";
  const std::string m = metrics(server->port());
  EXPECT_NE(m.find("kvtier_http_timeouts_total 2"), std::string::npos) << m << "\n" << answer;
  EXPECT_EQ(server->stop(SIGTERM), 0) << server->log();
}

// A TLS connection that never sends its ClientHello, or sends something else, holds nothing:
// the handshake has the request's deadline, and the failure is counted.
TEST_F(ServerHttpConnectionTest, ATlsConnectionThatNeverShakesHandsIsClosedAtTheDeadline) {
  auto cert = testing::write_self_signed_cert(dir_.str());
  auto server = start({"--tls-cert", cert.cert, "--tls-key", cert.key, "--request-timeout", "1"});
  const int silent = testing::connect_loopback(server->port(), 10);
  const int plain = testing::connect_loopback(server->port(), 10);
  const auto silent_closed = until_closed(silent);
  EXPECT_LT(silent_closed, std::chrono::seconds(4));
  EXPECT_EQ(exchange(plain, kHealthz), "") << "plain HTTP to the TLS port gets no answer";
  ::close(silent);
  ::close(plain);
  std::string m;
  for (int attempt = 0; attempt < 50; ++attempt) {
    m = metrics(server->port(), &cert);
    if (m.find("kvtier_http_tls_handshake_failures_total 2") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_NE(m.find("kvtier_http_tls_handshake_failures_total 2"), std::string::npos) << m;
  EXPECT_EQ(server->stop(SIGTERM), 0) << server->log();
}

}  // namespace
}  // namespace kvtier
