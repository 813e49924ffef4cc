// The binary block protocol on the real kvtierd: frames built by hand from the byte layout that
// docs/wire-protocol.md gives, the C++ client against the HTTP routes on one store, the same
// statuses for the same faults, auth and namespaces, and the limits HTTP could not have (a cap of
// connections per client, a deadline on a trickled request), and batch GETs that stream past the
// old 256 MiB / 4096-hash caps on both doors.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>

#include <gtest/gtest.h>

#include "server/cli/kvtier_client.h"
#include "server/wire/wire_client.h"
#include "tests/server/raw_requests.h"
#include "tests/server/server_process.h"
#include "tests/server/wire_blocks.h"
#include "tests/support/temp_dir.h"

namespace kvtier {
namespace {

using nlohmann::json;
using testing::binary_port;
using testing::read_all;
using testing::read_reply;
using testing::RawReply;
using testing::request_bytes;
using testing::ServerProcess;

std::string doc_string(const Bytes& b) { return std::string(b.begin(), b.end()); }

class ServerWireTest : public testing::ServerFixture {
 protected:
  std::string metrics(int port) {
    KvtierClient c("127.0.0.1", port, admin_key_);
    auto m = c.metrics();
    return m.ok() ? *m : m.status().to_string();
  }
  std::string admin_key_;
};

TEST_F(ServerWireTest, HandWrittenFramesStoreAndServeTheSameBytesAsHttp) {
  auto server = start({});
  const int port = binary_port(server->port());
  ASSERT_GT(port, 0) << "/healthz names the binary port";
  const auto blocks = testing::prompt_blocks(testing::tiny_layout(DType::kBF16), "m", testing::prompt(7, 48));
  const int fd = testing::connect_loopback(port, 10);
  ASSERT_GE(fd, 0);
  const std::string doc = doc_string(blocks[0].document);
  std::string req = request_bytes(2, "m", blocks[0].hash, doc);  // PUT
  ASSERT_EQ(::send(fd, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
  RawReply put = read_reply(fd);
  EXPECT_EQ(put.status, 201);
  EXPECT_EQ(put.body_bytes, 0u);

  KvtierClient http("127.0.0.1", server->port());
  http.use_binary(false);
  auto over_http = http.get(blocks[0].hash, "m");
  ASSERT_TRUE(over_http.ok()) << over_http.status().to_string();
  EXPECT_EQ(doc_string(*over_http), doc) << "a block stored over the binary port is the block HTTP serves";
  ASSERT_TRUE(http.put(blocks[1].hash, blocks[1].document, "m").ok());

  req = request_bytes(3, "m", blocks[1].hash, "");  // GET, on the same connection
  ::send(fd, req.data(), req.size(), 0);
  RawReply got = read_reply(fd);
  EXPECT_EQ(got.status, 200);
  EXPECT_EQ(got.body, doc_string(blocks[1].document));

  req = request_bytes(3, "m", blocks[2].hash, "");  // a miss: 404 with the HTTP API's JSON error
  ::send(fd, req.data(), req.size(), 0);
  RawReply miss = read_reply(fd);
  EXPECT_EQ(miss.status, 404);
  EXPECT_EQ(json::parse(miss.body)["error"]["code"], "not_found");

  req = request_bytes(5, "m", blocks[0].hash, "");  // DELETE
  ::send(fd, req.data(), req.size(), 0);
  EXPECT_EQ(read_reply(fd).status, 204);
  EXPECT_EQ(http.get(blocks[0].hash, "m").status().code(), StatusCode::kNotFound);
  ::close(fd);
  EXPECT_EQ(server->stop(SIGTERM), 0) << server->log();
}

TEST_F(ServerWireTest, BadRequestsGetTheHttpStatusesAndStoreNothing) {
  auto server = start({});
  const int port = binary_port(server->port());
  const auto layout = testing::tiny_layout(DType::kBF16);
  const auto blocks = testing::prompt_blocks(layout, "m", testing::prompt(8, 32));
  WireClient c("127.0.0.1", port);
  // A document under the wrong hash: 422 over HTTP, kFailedPrecondition here too.
  EXPECT_EQ(c.put(blocks[1].hash, blocks[0].document, "m").status().code(), StatusCode::kFailedPrecondition);
  // Not a document at all.
  const Bytes junk(1000, 7);
  EXPECT_EQ(c.put(blocks[0].hash, junk, "m").status().code(), StatusCode::kInvalidArgument);
  // Too large to be a block: refused before the body is read (413), and the client goes on.
  const Bytes huge(layout->dense_block_bytes() + (17u << 20), 0);
  auto too_big = c.put(blocks[0].hash, huge, "m");
  EXPECT_EQ(too_big.status().code(), StatusCode::kInvalidArgument) << too_big.status().to_string();
  EXPECT_NE(too_big.status().message().find("at most"), std::string::npos) << too_big.status().to_string();
  EXPECT_FALSE(c.get(blocks[0].hash, "m").ok()) << "nothing was stored";
  ASSERT_TRUE(c.put(blocks[0].hash, blocks[0].document, "m").ok()) << "the client reconnected after the refusal";
  auto back = c.get(blocks[0].hash, "m");
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(*back == blocks[0].document);

  // HTTP on the binary port: one 400 frame naming the problem, then the connection closes.
  const int fd = testing::connect_loopback(port, 10);
  const std::string http_request = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" + std::string(64, ' ');
  ::send(fd, http_request.data(), http_request.size(), 0);
  RawReply r = read_reply(fd);
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("magic"), std::string::npos) << r.body;
  char byte;
  EXPECT_EQ(::recv(fd, &byte, 1, 0), 0) << "closed after a frame it cannot resync from";
  ::close(fd);
  EXPECT_NE(metrics(server->port()).find("kvtier_wire_protocol_errors_total 1"), std::string::npos);
  EXPECT_EQ(server->stop(SIGTERM), 0) << server->log();
}

TEST_F(ServerWireTest, KeysAndNamespacesAreHttpsOwn) {
  const json table{{"keys",
                    {{{"tenant", "a"}, {"key", "key-a-0123456789abcdef"}, {"namespaces", {"a"}}},
                     {{"tenant", "b"}, {"key", "key-b-0123456789abcdef"}, {"namespaces", {"b"}}},
                     {{"tenant", "ops"}, {"key", "key-admin-0123456789abcdef"}, {"admin", true}}}}};
  const std::string keys = (dir_ / "keys.json").string();
  std::ofstream(keys) << table.dump();
  admin_key_ = "key-admin-0123456789abcdef";
  auto server = start({"--api-keys", keys});
  const int port = binary_port(server->port());
  ASSERT_GT(port, 0);
  const auto layout = testing::tiny_layout(DType::kBF16);
  const auto a_blocks = testing::prompt_blocks(layout, "a", testing::prompt(9, 16));
  WireClient a("127.0.0.1", port, "key-a-0123456789abcdef");
  WireClient b("127.0.0.1", port, "key-b-0123456789abcdef");
  WireClient wrong("127.0.0.1", port, "key-c-0123456789abcdef");
  WireClient none("127.0.0.1", port);
  ASSERT_TRUE(a.put(a_blocks[0].hash, a_blocks[0].document).ok()) << "a key with one namespace needs not name it";
  EXPECT_EQ(b.get(a_blocks[0].hash, "a").status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(b.get(a_blocks[0].hash).status().code(), StatusCode::kNotFound) << "in b's own namespace it is a miss";
  EXPECT_EQ(wrong.get(a_blocks[0].hash, "a").status().code(), StatusCode::kFailedPrecondition);  // 401
  EXPECT_EQ(none.get(a_blocks[0].hash, "a").status().code(), StatusCode::kFailedPrecondition);   // 401: no HELLO
  EXPECT_EQ(b.erase(a_blocks[0].hash, "a").code(), StatusCode::kPermissionDenied);
  auto mine = a.get(a_blocks[0].hash);
  ASSERT_TRUE(mine.ok());
  EXPECT_TRUE(*mine == a_blocks[0].document);
  // The KvtierClient with a key finds the port and authenticates on it.
  KvtierClient kc("127.0.0.1", server->port(), "key-a-0123456789abcdef");
  ASSERT_TRUE(kc.binary_in_use());
  auto via = kc.get(a_blocks[0].hash);
  ASSERT_TRUE(via.ok()) << via.status().to_string();
  EXPECT_NE(metrics(server->port()).find("kvtier_wire_requests_total{op=\"hello\",code=\"401\"} 1"), std::string::npos);
  EXPECT_EQ(server->stop(SIGTERM), 0) << server->log();
}

TEST_F(ServerWireTest, AClientPastItsConnectionCapIsRefusedAndOthersAreNot) {
  auto server = start({"--max-connections-per-client", "3"});
  const int port = binary_port(server->port());
  const auto blocks = testing::prompt_blocks(testing::tiny_layout(DType::kBF16), "m", testing::prompt(10, 16));
  std::vector<std::unique_ptr<WireClient>> held;
  for (int i = 0; i < 3; ++i) {
    held.push_back(std::make_unique<WireClient>("127.0.0.1", port));
    ASSERT_EQ(held.back()->get(blocks[0].hash, "m").status().code(), StatusCode::kNotFound);
  }
  WireClient fourth("127.0.0.1", port);
  auto refused = fourth.get(blocks[0].hash, "m");
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted) << refused.status().to_string();
  EXPECT_NE(refused.status().message().find("too many connections"), std::string::npos);
  held.pop_back();  // one closes: its place is free again
  for (int attempt = 0; attempt < 50; ++attempt) {
    WireClient again("127.0.0.1", port);
    if (again.get(blocks[0].hash, "m").status().code() == StatusCode::kNotFound) break;
    ASSERT_LT(attempt, 49) << "the freed place was never given back";
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_NE(metrics(server->port()).find("kvtier_wire_connections_refused_total{reason=\"per_client_cap\"} "),
            std::string::npos);
  EXPECT_EQ(server->stop(SIGTERM), 0) << server->log();
}

TEST_F(ServerWireTest, ATrickledRequestOrASilentConnectionIsClosedAtItsDeadline) {
  auto server = start({"--request-timeout", "1", "--idle-timeout", "1"});
  const int port = binary_port(server->port());
  const int slow = testing::connect_loopback(port, 10);
  const int silent = testing::connect_loopback(port, 10);
  const std::string half = request_bytes(3, "m", BlockHash{}, "").substr(0, 20);
  ::send(slow, half.data(), half.size(), 0);  // and never the rest
  for (int fd : {slow, silent}) {
    const auto t0 = std::chrono::steady_clock::now();
    char byte;
    EXPECT_EQ(::recv(fd, &byte, 1, 0), 0) << "the server closes it";
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
    ::close(fd);
  }
  const std::string m = metrics(server->port());
  EXPECT_NE(m.find("kvtier_wire_timeouts_total 1"), std::string::npos) << m;
  EXPECT_NE(m.find("kvtier_wire_idle_closed_total 1"), std::string::npos) << m;
  EXPECT_EQ(server->stop(SIGTERM), 0) << server->log();
}

TEST_F(ServerWireTest, BatchGetStreamsPastTheOldCapsInRequestOrderOnBothDoors) {
  auto server = start({});
  const auto layout = testing::tiny_layout(DType::kBF16);
  const auto blocks = testing::prompt_blocks(layout, "m", testing::prompt(11, 16 * 12));
  KvtierClient binary("127.0.0.1", server->port()), http("127.0.0.1", server->port());
  http.use_binary(false);
  ASSERT_TRUE(binary.binary_in_use());
  for (const auto& b : blocks) ASSERT_TRUE(binary.put(b.hash, b.document, "m").ok());
  // 9,000 hashes (the HTTP route used to take 4,096), the stored ones on both sides of the
  // server's 64 MiB slices (4,096 tiny blocks each).
  std::vector<BlockHash> ask(9000);
  for (size_t i = 0; i < ask.size(); ++i) ask[i].bytes[0] = static_cast<uint8_t>(i), ask[i].bytes[1] = static_cast<uint8_t>(i >> 8), ask[i].bytes[31] = 0xee;
  const std::vector<size_t> at{0, 4095, 4096, 4097, 8191, 8192, 8999, 17, 5000, 6000, 7000, 100};
  for (size_t i = 0; i < blocks.size(); ++i) ask[at[i]] = blocks[i].hash;
  for (KvtierClient* c : {&binary, &http}) {
    auto got = c->batch_get(ask, "m");
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    ASSERT_EQ(got->size(), ask.size());
    size_t hits = 0;
    for (size_t i = 0; i < ask.size(); ++i) {
      const auto where = std::find(at.begin(), at.end(), i);
      if (where == at.end()) {
        EXPECT_FALSE((*got)[i]) << i;
        continue;
      }
      ASSERT_TRUE((*got)[i]) << i;
      EXPECT_TRUE(*(*got)[i] == blocks[where - at.begin()].document) << i;
      ++hits;
    }
    EXPECT_EQ(hits, blocks.size());
    EXPECT_TRUE(c->get(blocks[0].hash, "m").ok()) << "the connection is usable after the stream";
  }
  EXPECT_EQ(server->stop(SIGTERM), 0) << server->log();
}

// More than the old 256 MiB cap in one reply: one stored block asked for 17,000 times (the
// server pins a slice at a time, so this costs it one slice, not 280 MB).
TEST_F(ServerWireTest, OneBatchGetStreamsMoreThan256MiB) {
  auto server = start({});
  const auto blocks = testing::prompt_blocks(testing::tiny_layout(DType::kBF16), "m", testing::prompt(12, 16));
  KvtierClient binary("127.0.0.1", server->port()), http("127.0.0.1", server->port());
  http.use_binary(false);
  ASSERT_TRUE(binary.put(blocks[0].hash, blocks[0].document, "m").ok());
  const std::vector<BlockHash> ask(17000, blocks[0].hash);
  ASSERT_GT(ask.size() * blocks[0].document.size(), 256ull << 20);
  for (KvtierClient* c : {&binary, &http}) {
    auto got = c->batch_get(ask, "m");
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    ASSERT_EQ(got->size(), ask.size());
    size_t same = 0;
    for (const auto& d : *got) same += d && *d == blocks[0].document;
    EXPECT_EQ(same, ask.size());
  }
  EXPECT_EQ(server->stop(SIGTERM), 0) << server->log();
}

TEST_F(ServerWireTest, BinaryPortOffIsNotOfferedAndClientsStayOnHttp) {
  auto off = start({"--binary-port", "off"});
  EXPECT_EQ(binary_port(off->port()), 0);
  KvtierClient c("127.0.0.1", off->port());
  EXPECT_FALSE(c.binary_in_use());
  EXPECT_EQ(off->stop(SIGTERM), 0);
}

}  // namespace
}  // namespace kvtier
