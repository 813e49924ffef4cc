// kvtierd over TLS: the real binary with a self-signed certificate made for the test. Blocks
// round-trip bit-exact over HTTPS, a client that does not trust the certificate or speaks plain
// HTTP gets nothing, and a certificate the server cannot use stops it at start with a message.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "server/cli/kvtier_client.h"
#include "tests/server/server_process.h"
#include "tests/server/wire_blocks.h"
#include "tests/support/self_signed_cert.h"
#include "tests/support/temp_dir.h"

namespace kvtier {
namespace {

using testing::ServerProcess;

class ServerTlsTest : public ::testing::Test {
 protected:
  void SetUp() override { cert_ = testing::write_self_signed_cert(dir_.str()); }

  std::unique_ptr<ServerProcess> start(const std::string& cert, const std::string& key,
                                       std::vector<std::string> extra = {}) {
    std::vector<std::string> args{"--layout", "tiny", "--tls-cert", cert, "--tls-key", key};
    args.insert(args.end(), extra.begin(), extra.end());
    return std::make_unique<ServerProcess>((dir_ / ("kvtierd-" + std::to_string(++started_) + ".log")).string(), args);
  }

  testing::TempDir dir_;
  testing::CertFiles cert_;
  int started_ = 0;
};

TEST_F(ServerTlsTest, BlocksRoundTripOverHttpsAndOnlyATrustingClientGetsThem) {
  auto server = start(cert_.cert, cert_.key, {"--api-key", "tls-test-key-0123"});
  ASSERT_GT(server->port(), 0) << server->log();
  KvtierClient c("127.0.0.1", server->port(), "tls-test-key-0123", {true, cert_.cert});
  const auto tokens = testing::prompt(5, 4 * 16);
  const auto blocks = testing::prompt_blocks(testing::tiny_layout(DType::kBF16), "m", tokens);
  for (const auto& b : blocks) {
    auto r = c.put(b.hash, b.document);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
  }
  for (const auto& b : blocks) {
    auto got = c.get(b.hash);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_TRUE(*got == b.document);
  }
  std::vector<BlockHash> hashes;
  for (const auto& b : blocks) hashes.push_back(b.hash);
  auto batch = c.batch_get(hashes);
  ASSERT_TRUE(batch.ok());
  for (size_t i = 0; i < blocks.size(); ++i) EXPECT_TRUE((*batch)[i] && *(*batch)[i] == blocks[i].document);
  auto seen = c.lookup("m", tokens);
  ASSERT_TRUE(seen.ok());
  EXPECT_EQ((*seen)["matched_tokens"], 64);
  // Blocks went over the binary port, inside TLS (server_wire_tls_test.cc has its own tests).
  EXPECT_TRUE(c.binary_in_use());

  // Plain HTTP to the TLS port, and HTTPS without trusting this certificate: no answer at all.
  KvtierClient plain("127.0.0.1", server->port(), "tls-test-key-0123");
  EXPECT_EQ(plain.raw("GET", "/v1/layout").status, 0);
  KvtierClient untrusting("127.0.0.1", server->port(), "tls-test-key-0123", {true, ""});
  const HttpReply r = untrusting.raw("GET", "/v1/layout");
  EXPECT_EQ(r.status, 0);
  EXPECT_FALSE(r.error.empty());
  EXPECT_EQ(server->stop(SIGTERM), 0) << server->log();
}

TEST_F(ServerTlsTest, ACertificateTheServerCannotUseStopsItAtStart) {
  const auto other = testing::write_self_signed_cert(dir_.str(), "other");
  std::ofstream(dir_ / "garbage.pem") << "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n";
  const std::pair<std::vector<std::string>, const char*> cases[] = {
      {{"--tls-cert", cert_.cert, "--tls-key", other.key}, "does not match"},
      {{"--tls-cert", (dir_ / "garbage.pem").string(), "--tls-key", cert_.key}, "TLS: cannot use"},
      {{"--tls-cert", (dir_ / "absent.pem").string(), "--tls-key", cert_.key}, "--tls-cert: cannot read"},
      {{"--tls-cert", cert_.cert}, "--tls-cert needs --tls-key"},
  };
  for (const auto& [args, message] : cases) {
    std::vector<std::string> argv{KVTIER_KVTIERD_PATH, "--port", "0", "--layout", "tiny"};
    argv.insert(argv.end(), args.begin(), args.end());
    const auto run = testing::run_program(argv, (dir_ / "refused.log").string());
    EXPECT_EQ(run.exit_code, 2) << run.output;
    EXPECT_NE(run.output.find(message), std::string::npos) << run.output;
  }
}

}  // namespace
}  // namespace kvtier
