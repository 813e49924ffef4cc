// Tenants on the real kvtierd: each key reaches only its namespaces, another tenant's block looks
// exactly like an absent one (or is a 403 when named), stats and metrics need the admin key,
// a namespace past its RAM quota gets 507 with nothing stored, and no key ever reaches the log.
#include <openssl/sha.h>

#include <chrono>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>

#include "server/cli/kvtier_client.h"
#include "server/tenant_table.h"
#include "tests/server/server_process.h"
#include "tests/server/wire_blocks.h"
#include "tests/support/temp_dir.h"

namespace kvtier {
namespace {

using nlohmann::json;
using testing::ServerProcess;

constexpr const char* kKeyA = "key-of-tenant-a-0123456789";
constexpr const char* kKeyB = "key-of-tenant-b-0123456789";
constexpr const char* kAdmin = "key-of-the-operator-012345";

std::string sha256_hex_of(const std::string& key) {
  unsigned char d[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(key.data()), key.size(), d);
  std::string out;
  for (unsigned char c : d) out += {"0123456789abcdef"[c >> 4], "0123456789abcdef"[c & 15]};
  return out;
}

// A message with the hash it names taken out, to compare two refusals' wording.
std::string without(std::string message, const BlockHash& hash) {
  const size_t at = message.find(hash.hex());
  if (at != std::string::npos) message.replace(at, hash.hex().size(), "<hash>");
  return message;
}

class ServerTenantsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    layout_ = testing::tiny_layout(DType::kBF16);
    const uint64_t block = layout_->dense_block_bytes();
    // Tenant b's key is given by its digest, as an operator who keeps no plaintext keys would.
    const json table{
        {"keys",
         {{{"tenant", "a"}, {"key", kKeyA}, {"namespaces", {"a"}}},
          {{"tenant", "b"}, {"key_sha256", sha256_hex_of(kKeyB)}, {"namespaces", {"b", "shared-*"}}},
          {{"tenant", "ops"}, {"key", kAdmin}, {"admin", true}}}},
        // Room for three blocks, not four: a stored block is its document (KV plus a JSON header
        // of under 2 KiB) and its token ids.
        {"quotas", {{"a", {{"ram", 7 * (block + 2048) / 2}}}}}};
    keys_ = (dir_ / "keys.json").string();
    std::ofstream(keys_) << table.dump(2);
    server_ = std::make_unique<ServerProcess>((dir_ / "kvtierd.log").string(),
                                              std::vector<std::string>{"--layout", "tiny", "--api-keys", keys_,
                                                                       "--ssd-cache-dir", (dir_ / "ssd").string()});
    ASSERT_GT(server_->port(), 0) << server_->log();
  }

  KvtierClient client(const char* key) { return KvtierClient("127.0.0.1", server_->port(), key); }

  testing::TempDir dir_;
  std::shared_ptr<const KvLayout> layout_;
  std::string keys_;
  std::unique_ptr<ServerProcess> server_;
};


TEST_F(ServerTenantsTest, EachKeyReachesOnlyItsNamespaces) {
  KvtierClient a = client(kKeyA), b = client(kKeyB), ops = client(kAdmin);
  const auto tokens = testing::prompt(7, 2 * 16);
  const auto blocks = testing::prompt_blocks(layout_, "a", tokens);
  for (const auto& blk : blocks) ASSERT_TRUE(a.put(blk.hash, blk.document).ok()) << "a's only namespace is the default";

  // a sees its prefix; b cannot name a's namespace, and in its own the same tokens are a miss.
  auto seen = a.lookup("a", tokens);
  ASSERT_TRUE(seen.ok()) << seen.status().to_string();
  EXPECT_EQ((*seen)["matched_tokens"], 32);
  EXPECT_EQ(b.lookup("a", tokens).status().code(), StatusCode::kPermissionDenied);
  auto own = b.lookup("b", tokens);
  ASSERT_TRUE(own.ok());
  EXPECT_EQ((*own)["matched_tokens"], 0);
  EXPECT_EQ(b.prefetch("a", tokens).status().code(), StatusCode::kPermissionDenied);

  // By hash: naming a's namespace is refused; naming its own, a's block is just not there.
  EXPECT_EQ(b.get(blocks[0].hash, "a").status().code(), StatusCode::kPermissionDenied);
  const auto miss = b.get(blocks[0].hash, "b");
  EXPECT_EQ(miss.status().code(), StatusCode::kNotFound);
  const BlockHash never_stored = testing::prompt_blocks(layout_, "b", tokens)[0].hash;
  const auto absent = b.get(never_stored, "b");
  EXPECT_EQ(without(miss.status().message(), blocks[0].hash), without(absent.status().message(), never_stored))
      << "another tenant's block must read exactly like an absent one";
  EXPECT_EQ(b.get(blocks[0].hash).status().code(), StatusCode::kInvalidArgument) << "b has two namespaces: it must name one";
  auto batch = b.batch_get(std::vector<BlockHash>{blocks[0].hash, blocks[1].hash}, "b");
  ASSERT_TRUE(batch.ok());
  EXPECT_FALSE((*batch)[0] || (*batch)[1]);
  EXPECT_EQ(b.batch_get(std::vector<BlockHash>{blocks[0].hash}, "a").status().code(), StatusCode::kPermissionDenied);

  // b can neither overwrite nor delete a's blocks.
  EXPECT_EQ(b.put(blocks[0].hash, blocks[0].document, "a").status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(b.put(blocks[0].hash, blocks[0].document, "b").status().code(), StatusCode::kFailedPrecondition)
      << "a document of namespace a stored as b's";
  EXPECT_EQ(b.erase(blocks[0].hash, "b").code(), StatusCode::kNotFound);
  EXPECT_EQ(b.erase(blocks[0].hash, "a").code(), StatusCode::kPermissionDenied);
  auto still = a.get(blocks[0].hash);
  ASSERT_TRUE(still.ok());
  EXPECT_TRUE(*still == blocks[0].document);

  // b's wildcard covers shared-*; a's own delete works.
  const auto shared = testing::prompt_blocks(layout_, "shared-docs", tokens);
  EXPECT_TRUE(b.put(shared[0].hash, shared[0].document, "shared-docs").ok());
  EXPECT_EQ(b.put(shared[0].hash, shared[0].document, "shared").status().code(), StatusCode::kPermissionDenied);
  EXPECT_TRUE(a.erase(blocks[1].hash).ok());

  // Stats and metrics span every tenant: admin only.
  EXPECT_EQ(a.stats().status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(b.metrics().status().code(), StatusCode::kPermissionDenied);
  ASSERT_TRUE(ops.stats().ok());
  EXPECT_TRUE(ops.erase(shared[0].hash).ok()) << "the admin key deletes any block";
  EXPECT_EQ(client("key-of-nobody-0123456789").lookup("a", tokens).status().code(), StatusCode::kFailedPrecondition)
      << "an unknown key is a 401";

  const std::string log = server_->log();
  for (const char* key : {kKeyA, kKeyB, kAdmin}) EXPECT_EQ(log.find(key), std::string::npos) << "a key reached the log";
}

TEST_F(ServerTenantsTest, ANamespacePastItsRamQuotaIsRefusedWith507AndKeepsWhatItHad) {
  KvtierClient a = client(kKeyA), b = client(kKeyB), ops = client(kAdmin);
  const auto tokens = testing::prompt(9, 5 * 16);
  const auto blocks = testing::prompt_blocks(layout_, "a", tokens);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(a.put(blocks[i].hash, blocks[i].document).ok());
  const HttpReply r = a.raw("PUT", "/v1/blocks/" + blocks[3].hash.hex(),
                            std::string(blocks[3].document.begin(), blocks[3].document.end()),
                            "application/octet-stream");
  EXPECT_EQ(r.status, 507) << r.body;
  EXPECT_NE(r.body.find("quota"), std::string::npos) << r.body;
  EXPECT_EQ(a.get(blocks[3].hash).status().code(), StatusCode::kNotFound) << "nothing half-stored";
  for (int i = 0; i < 3; ++i) {
    auto got = a.get(blocks[i].hash);
    ASSERT_TRUE(got.ok());
    EXPECT_TRUE(*got == blocks[i].document);
  }
  // Other namespaces are not bound by a's quota.
  const auto theirs = testing::prompt_blocks(layout_, "b", tokens);
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(b.put(theirs[i].hash, theirs[i].document, "b").ok());
  // Freeing room makes room.
  ASSERT_TRUE(a.erase(blocks[2].hash).ok());
  EXPECT_TRUE(a.put(blocks[3].hash, blocks[3].document).ok());

  auto metrics = ops.metrics();
  ASSERT_TRUE(metrics.ok());
  EXPECT_NE(metrics->find("kvtier_namespace_quota_refusals_total{tier=\"ram\",namespace=\"a\"} 1"), std::string::npos)
      << *metrics;
}

// An SSD quota bounds what a namespace's spills may take on disk: RAM (three blocks here) evicts
// to the SSD, which takes the namespace's records up to its quota and refuses the rest (counted).
// Every GET is the exact block or a miss; a namespace without a quota keeps all it spilled.
TEST(ServerSsdQuotaTest, SpillsPastANamespacesSsdQuotaAreRefusedAndCounted) {
  testing::TempDir dir;
  const json table{{"keys", {{{"tenant", "b"}, {"key", kKeyB}, {"namespaces", {"b", "q"}}},
                             {{"tenant", "ops"}, {"key", kAdmin}, {"admin", true}}}},
                   {"quotas", {{"q", {{"ssd", "60K"}}}}}};  // about three 20 KiB records
  std::ofstream((dir / "keys.json").string()) << table.dump();
  ServerProcess server((dir / "kvtierd.log").string(),
                       {"--layout", "tiny", "--api-keys", (dir / "keys.json").string(), "--ram-capacity", "64K",
                        "--ssd-cache-dir", (dir / "ssd").string()});
  ASSERT_GT(server.port(), 0) << server.log();
  KvtierClient b("127.0.0.1", server.port(), kKeyB), ops("127.0.0.1", server.port(), kAdmin);
  const auto layout = testing::tiny_layout(DType::kBF16);
  const auto tokens = testing::prompt(21, 10 * 16);
  const auto quoted = testing::prompt_blocks(layout, "q", tokens);
  const auto free = testing::prompt_blocks(layout, "b", tokens);
  for (size_t i = 0; i < quoted.size(); ++i) {
    ASSERT_TRUE(b.put(quoted[i].hash, quoted[i].document, "q").ok());
    ASSERT_TRUE(b.put(free[i].hash, free[i].document, "b").ok());
  }
  std::string m;
  const std::string refusals = "kvtier_namespace_quota_refusals_total{tier=\"ssd\",namespace=\"q\"} ";
  for (int attempt = 0; attempt < 250; ++attempt) {  // the spills are written in the background
    m = *ops.metrics();
    const size_t at = m.find(refusals);
    if (at != std::string::npos && std::stoul(m.substr(at + refusals.size())) > 0 &&
        m.find("kvtier_spill_queue_bytes 0") != std::string::npos) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const size_t at = m.find(refusals);
  ASSERT_NE(at, std::string::npos) << m;
  EXPECT_GE(std::stoul(m.substr(at + refusals.size())), 1u) << m;
  const std::string used = "kvtier_namespace_used_bytes{tier=\"ssd\",namespace=\"q\"} ";
  const size_t u = m.find(used);
  ASSERT_NE(u, std::string::npos) << m;
  EXPECT_LE(std::stod(m.substr(u + used.size())), 60.0 * 1024) << m;
  EXPECT_GT(std::stod(m.substr(u + used.size())), 0.0) << m;
  EXPECT_NE(m.find("kvtier_spill_dropped_total{reason=\"quota\"} "), std::string::npos);

  size_t quoted_held = 0, free_held = 0;
  for (size_t i = 0; i < quoted.size(); ++i) {
    auto got = b.get(quoted[i].hash, "q");
    if (got.ok()) {
      EXPECT_TRUE(*got == quoted[i].document);
      ++quoted_held;
    } else {
      EXPECT_EQ(got.status().code(), StatusCode::kNotFound) << got.status().to_string();
    }
    auto theirs = b.get(free[i].hash, "b");
    ASSERT_TRUE(theirs.ok()) << "b has no SSD quota: " << theirs.status().to_string();
    EXPECT_TRUE(*theirs == free[i].document);
    ++free_held;
  }
  EXPECT_LT(quoted_held, quoted.size()) << "the quota held some of q's spills back";

  // A DELETE naming another namespace is a miss and moves nothing: the block on the SSD is not
  // promoted into RAM on the way.
  const auto promotions = [&] {
    const std::string text = *ops.metrics(), name = "\nkvtier_promotions_total ";
    return std::stoul(text.substr(text.find(name) + name.size()));
  };
  const uint64_t before = promotions();
  EXPECT_EQ(b.erase(free[0].hash, "q").code(), StatusCode::kNotFound);
  EXPECT_EQ(promotions(), before);
  EXPECT_TRUE(b.get(free[0].hash, "b").ok()) << "still there for its own namespace";
  EXPECT_EQ(free_held, free.size());
  EXPECT_EQ(server.stop(SIGTERM), 0) << server.log();
}

TEST(TenantTableTest, RefusesFilesItCannotEnforce) {
  auto parse = [](const std::string& text) { return TenantTable::parse(text).status(); };
  EXPECT_TRUE(parse(R"({"keys":[{"tenant":"a","key":"0123456789abcdef","namespaces":["a"]}]})").ok());
  const std::pair<const char*, const char*> bad[] = {
      {R"({"keys":[]})", "non-empty"},
      {R"({"keys":[{"tenant":"a","key":"short","namespaces":["a"]}]})", "16 characters"},
      {R"({"keys":[{"tenant":"a","key":"0123456789abcdef"}]})", "needs 'namespaces'"},
      {R"({"keys":[{"key":"0123456789abcdef","namespaces":["a"]}]})", "'tenant'"},
      {R"({"keys":[{"tenant":"a","key":"0123456789abcdef","key_sha256":"00","namespaces":["a"]}]})", "exactly one"},
      {R"({"keys":[{"tenant":"a","key_sha256":"xyz","namespaces":["a"]}]})", "64 hex"},
      {R"({"keys":[{"tenant":"a","key":"0123456789abcdef","namespaces":["a"]},)"
       R"({"tenant":"b","key":"0123456789abcdef","namespaces":["b"]}]})", "twice"},
      {R"({"keys":[{"tenant":"a","key":"0123456789abcdef","namespaces":["a"],"nmespaces":[]}]})", "unknown field"},
      {R"({"keys":[{"tenant":"a","key":"0123456789abcdef","namespaces":["a"]}],"quotas":{"a":{"disk":"1G"}}})", "unknown field"},
      {R"({"keys":[{"tenant":"a","key":"0123456789abcdef","namespaces":["a"]}],"quotas":{"a":{"ssd":"lots"}}})", "ssd"},
      {R"({"keys":[{"tenant":"a","key":"0123456789abcdef","namespaces":["a"]}],"quotas":{"a":{"ram":"lots"}}})", "ram"},
      {R"({"keys":[{"tenant":"a","key":"0123456789abcdef","namespaces":["a"]}],"quota":{}})", "unknown key"},
  };
  for (const auto& [text, why] : bad) {
    const Status st = parse(text);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << text;
    EXPECT_NE(st.message().find(why), std::string::npos) << text << " -> " << st.message();
  }
  auto table = TenantTable::parse(R"({"keys":[{"tenant":"a","key":"0123456789abcdef","namespaces":["a","p-*"]}]})");
  ASSERT_TRUE(table.ok());
  const Tenant* a = table->authenticate("0123456789abcdef");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(table->authenticate("0123456789abcdeF"), nullptr);
  EXPECT_EQ(table->authenticate(""), nullptr);
  EXPECT_TRUE(a->may_use("a") && a->may_use("p-1") && a->may_use("p-"));
  EXPECT_FALSE(a->may_use("b") || a->may_use("p") || a->may_use("aa") || a->may_use(""));
}

}  // namespace
}  // namespace kvtier
