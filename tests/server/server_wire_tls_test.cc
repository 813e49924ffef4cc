// The binary port inside TLS (kvtierd with --tls-cert): the same frames and statuses as the clear
// door, the clients finding it through /healthz and verifying the certificate as they do for
// HTTPS, and what a client that cannot or will not do TLS gets: nothing, counted.
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <fstream>

#include <gtest/gtest.h>

#include "base/net/socket_io.h"
#include "server/cli/kvtier_client.h"
#include "server/net/tls_channel.h"
#include "server/net/tls_context.h"
#include "server/wire/wire_client.h"
#include "server/wire/wire_format.h"
#include "tests/server/raw_requests.h"
#include "tests/server/server_process.h"
#include "tests/server/wire_blocks.h"
#include "tests/support/self_signed_cert.h"

namespace kvtier {
namespace {

using nlohmann::json;
using testing::request_bytes;
using Clock = std::chrono::steady_clock;

// A hand-rolled TLS client of the binary port: raw frames in, raw replies out.
class RawTlsConnection {
 public:
  RawTlsConnection(int port, const TlsContext& trust) : fd_(testing::connect_loopback(port, 10)) {
    if (fd_ < 0) return;
    channel_ = std::make_unique<TlsChannel>(fd_, trust.new_client_session(fd_, "127.0.0.1"));
    handshake_ = channel_->connect(Clock::now() + std::chrono::seconds(10));
  }
  ~RawTlsConnection() {
    channel_.reset();
    if (fd_ >= 0) ::close(fd_);
  }
  const Status& handshake() const { return handshake_; }
  Status send(const std::string& bytes) {
    iovec piece{const_cast<char*>(bytes.data()), bytes.size()};
    return channel_->send_all(std::span(&piece, 1), Clock::now() + std::chrono::seconds(10));
  }
  // The next reply; status 0 when the connection closed first.
  testing::RawReply reply() {
    std::array<uint8_t, wire::kResponseHeaderBytes> head;
    if (!channel_->recv_exact(head.data(), head.size(), Clock::now() + std::chrono::seconds(10)).ok()) return {};
    auto h = wire::decode_response(head);
    if (!h.ok()) return {};
    testing::RawReply r{h->status, h->body_bytes, std::string(h->body_bytes, '\0')};
    if (!channel_->recv_exact(r.body.data(), r.body.size(), Clock::now() + std::chrono::seconds(10)).ok()) return {};
    return r;
  }
  bool closed_by_server() {
    char byte;
    return !channel_->recv_exact(&byte, 1, Clock::now() + std::chrono::seconds(10)).ok();
  }

 private:
  int fd_;
  std::unique_ptr<TlsChannel> channel_;
  Status handshake_ = unavailable("no connection");
};

class ServerWireTlsTest : public testing::ServerFixture {
 protected:
  void SetUp() override {
    cert_ = testing::write_self_signed_cert(dir_.str());
    trust_ = std::move(TlsContext::client(cert_.cert)).value();
  }
  std::unique_ptr<testing::ServerProcess> start_tls(std::vector<std::string> extra = {}) {
    std::vector<std::string> args{"--tls-cert", cert_.cert, "--tls-key", cert_.key};
    args.insert(args.end(), extra.begin(), extra.end());
    return start(args);
  }
  KvtierClient https(int port, const std::string& key = "") { return KvtierClient("127.0.0.1", port, key, {true, cert_.cert}); }
  json healthz(int port) { return json::parse(https(port).raw("GET", "/healthz").body, nullptr, false); }
  std::string metrics(int port, const std::string& key = "") {
    auto m = https(port, key).metrics();
    return m.ok() ? *m : m.status().to_string();
  }

  testing::CertFiles cert_;
  std::shared_ptr<const TlsContext> trust_;
};

TEST_F(ServerWireTlsTest, BlocksRoundTripBitExactOnTheBinaryPortInsideTls) {
  auto server = start_tls();
  const json h = healthz(server->port());
  ASSERT_TRUE(h.contains("binary_port")) << h.dump();
  EXPECT_EQ(h["binary_tls"], true) << "the port is named with the fact that it speaks TLS";
  KvtierClient c = https(server->port());
  ASSERT_TRUE(c.binary_in_use()) << "a verifying client takes the TLS port";
  const auto blocks = testing::prompt_blocks(testing::tiny_layout(DType::kBF16), "m", testing::prompt(21, 6 * 16));
  for (const auto& b : blocks) ASSERT_TRUE(c.put(b.hash, b.document, "m").ok());
  std::vector<BlockHash> hashes;
  for (const auto& b : blocks) {
    auto got = c.get(b.hash, "m");
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_TRUE(*got == b.document);
    hashes.push_back(b.hash);
  }
  auto batch = c.batch_get(hashes, "m");
  ASSERT_TRUE(batch.ok()) << batch.status().to_string();
  for (size_t i = 0; i < blocks.size(); ++i) EXPECT_TRUE((*batch)[i] && *(*batch)[i] == blocks[i].document);
  // Over HTTPS the same store answers with the same bytes.
  KvtierClient over_https = https(server->port());
  over_https.use_binary(false);
  auto via_https = over_https.get(blocks[3].hash, "m");
  ASSERT_TRUE(via_https.ok());
  EXPECT_TRUE(*via_https == blocks[3].document);
  const std::string m = metrics(server->port());
  EXPECT_NE(m.find("kvtier_wire_requests_total{op=\"put\",code=\"201\"} 6"), std::string::npos) << m;
  EXPECT_NE(m.find("kvtier_wire_tls_handshake_failures_total 0"), std::string::npos) << m;
  EXPECT_EQ(server->stop(SIGTERM), 0) << server->log();
}

TEST_F(ServerWireTlsTest, HandWrittenFramesInsideTlsGetTheClearDoorsStatuses) {
  const json table{{"keys", {{{"tenant", "a"}, {"key", "key-a-0123456789abcdef"}, {"namespaces", {"a"}}},
                             {{"tenant", "ops"}, {"key", "key-admin-0123456789abcdef"}, {"admin", true}}}}};
  const std::string keys = (dir_ / "keys.json").string();
  std::ofstream(keys) << table.dump();
  auto server = start_tls({"--api-keys", keys});
  const int port = healthz(server->port())["binary_port"].get<int>();
  const auto layout = testing::tiny_layout(DType::kBF16);
  const auto blocks = testing::prompt_blocks(layout, "a", testing::prompt(22, 32));
  const std::string doc(blocks[0].document.begin(), blocks[0].document.end());
  {
    RawTlsConnection c(port, *trust_);
    ASSERT_TRUE(c.handshake().ok()) << c.handshake().to_string();
    ASSERT_TRUE(c.send(request_bytes(3, "a", blocks[0].hash, "")).ok());  // GET before HELLO
    EXPECT_EQ(c.reply().status, 401);
  }
  {
    RawTlsConnection c(port, *trust_);
    ASSERT_TRUE(c.send(request_bytes(1, "", BlockHash{}, "key-a-0123456789abcdef")).ok());  // HELLO
    EXPECT_EQ(c.reply().status, 200);
    ASSERT_TRUE(c.send(request_bytes(2, "a", blocks[0].hash, doc)).ok());
    EXPECT_EQ(c.reply().status, 201);
    ASSERT_TRUE(c.send(request_bytes(3, "b", blocks[0].hash, "")).ok());
    EXPECT_EQ(c.reply().status, 403) << "another tenant's namespace";
    ASSERT_TRUE(c.send(request_bytes(2, "a", blocks[1].hash, doc)).ok());
    EXPECT_EQ(c.reply().status, 422) << "a document under another block's hash";
    ASSERT_TRUE(c.send(request_bytes(3, std::string(1025, 'n'), blocks[0].hash, "")).ok());
    testing::RawReply too_long = c.reply();
    EXPECT_EQ(too_long.status, 400) << too_long.body;
    EXPECT_TRUE(c.closed_by_server()) << "a refused frame ends the connection";
  }
  {
    RawTlsConnection c(port, *trust_);
    ASSERT_TRUE(c.send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" + std::string(64, ' ')).ok());
    testing::RawReply r = c.reply();
    EXPECT_EQ(r.status, 400);
    EXPECT_NE(r.body.find("magic"), std::string::npos) << r.body;
  }
  WireClient a("127.0.0.1", port, "key-a-0123456789abcdef", trust_);
  auto got = a.get(blocks[0].hash);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(*got == blocks[0].document);
  const std::string m = metrics(server->port(), "key-admin-0123456789abcdef");
  EXPECT_NE(m.find("kvtier_wire_protocol_errors_total 1"), std::string::npos) << m;
  EXPECT_NE(m.find("kvtier_wire_requests_total{op=\"get\",code=\"401\"} 1"), std::string::npos) << m;
  EXPECT_EQ(server->stop(SIGTERM), 0) << server->log();
}

TEST_F(ServerWireTlsTest, ClientsThatDoNotTrustTheCertificateOrSpeakClearTextGetNothingAndAreCounted) {
  auto server = start_tls({"--request-timeout", "1"});
  const int port = healthz(server->port())["binary_port"].get<int>();
  const auto blocks = testing::prompt_blocks(testing::tiny_layout(DType::kBF16), "m", testing::prompt(23, 16));
  ASSERT_TRUE(https(server->port()).put(blocks[0].hash, blocks[0].document, "m").ok());
  // The system's trust store does not hold the test's self-signed certificate.
  WireClient untrusting("127.0.0.1", port, "", std::move(TlsContext::client("")).value());
  auto refused = untrusting.get(blocks[0].hash, "m");
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition) << refused.status().to_string();
  EXPECT_NE(refused.status().message().find("not trusted"), std::string::npos) << refused.status().to_string();
  // A clear-text client's frame is not a ClientHello.
  WireClient clear("127.0.0.1", port);
  EXPECT_FALSE(clear.get(blocks[0].hash, "m").ok());
  // A client that connects and never starts the handshake is closed at --request-timeout.
  const int silent = testing::connect_loopback(port, 10);
  const auto t0 = Clock::now();
  char byte;
  EXPECT_EQ(::recv(silent, &byte, 1, 0), 0);
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));
  ::close(silent);
  // A plain-HTTP client of kvtierd is never sent to the TLS port, and a TLS client never to a
  // clear one (checked on the other side by ServerTlsTest and ServerWireTest).
  KvtierClient plain("127.0.0.1", server->port());
  EXPECT_FALSE(plain.binary_in_use());
  const std::string m = metrics(server->port());
  EXPECT_NE(m.find("kvtier_wire_tls_handshake_failures_total 3"), std::string::npos) << m;
  EXPECT_EQ(server->stop(SIGTERM), 0) << server->log();
}

}  // namespace
}  // namespace kvtier
