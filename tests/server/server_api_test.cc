// kvtierd as its clients see it: the real binary on a loopback port, real RocksDB and io_uring
// underneath. Blocks go in and come back byte for byte in every dtype, survive a restart, and
// every kind of bad request gets its status and changes nothing.
#include <signal.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "server/cli/kvtier_client.h"
#include "tests/server/server_process.h"
#include "tests/server/wire_blocks.h"
#include "tests/support/temp_dir.h"

namespace kvtier {
namespace {

using nlohmann::json;
using testing::ServerProcess;
using testing::WireBlock;

std::string bytes_str(const Bytes& b) { return std::string(b.begin(), b.end()); }

class ServerApiTest : public ::testing::Test {
 protected:
  std::unique_ptr<ServerProcess> start(std::vector<std::string> args) {
    auto s = std::make_unique<ServerProcess>((dir_ / ("kvtierd-" + std::to_string(++started_) + ".log")).string(),
                                             std::move(args));
    EXPECT_GT(s->port(), 0) << s->log();
    return s;
  }
  std::string ssd() const { return (dir_ / "ssd").string(); }
  // A kvtierd run that stores `blocks` and is stopped with `sig`, cleanly; its log.
  std::string store_and_stop(const std::vector<std::string>& args, const std::vector<WireBlock>& blocks, int sig);

  testing::TempDir dir_;
  int started_ = 0;
};

void put_all(KvtierClient& c, const std::vector<WireBlock>& blocks, bool expect_stored) {
  for (const WireBlock& b : blocks) {
    auto r = c.put(b.hash, b.document);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(*r, expect_stored);
  }
}

std::string ServerApiTest::store_and_stop(const std::vector<std::string>& args, const std::vector<WireBlock>& blocks,
                                          int sig) {
  auto server = start(args);
  KvtierClient c("127.0.0.1", server->port());
  put_all(c, blocks, true);
  EXPECT_EQ(server->stop(sig), 0);
  return server->log();
}

void expect_served(KvtierClient& c, const std::vector<WireBlock>& blocks) {
  for (const WireBlock& b : blocks) {
    auto got = c.get(b.hash);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_TRUE(*got == b.document) << "block " << b.hash.hex() << " came back different";
  }
}

class ServerDtypeTest : public ServerApiTest, public ::testing::WithParamInterface<DType> {};

TEST_P(ServerDtypeTest, BlocksRoundTripBitExact) {
  const auto layout = testing::tiny_layout(GetParam());
  auto server = start({"--layout", testing::write_layout_file(dir_.str(), GetParam()), "--ssd-cache-dir", ssd()});
  KvtierClient c("127.0.0.1", server->port());
  ASSERT_TRUE(c.binary_in_use()) << "kvtierd offers its binary port by default";
  KvtierClient http("127.0.0.1", server->port());
  http.use_binary(false);
  const auto tokens = testing::prompt(1, 5 * 16 + 3);
  const auto blocks = testing::prompt_blocks(layout, "model-a", tokens);
  ASSERT_EQ(blocks.size(), 5u);

  auto before = c.lookup("model-a", tokens);
  ASSERT_TRUE(before.ok());
  EXPECT_EQ((*before)["matched_tokens"], 0);
  ASSERT_EQ((*before)["missing"].size(), 5u);
  EXPECT_EQ((*before)["missing"][0]["hash"], blocks[0].hash.hex());
  EXPECT_EQ((*before)["missing"][1]["parent_hash"], blocks[0].hash.hex());

  put_all(c, blocks, /*expect_stored=*/true);
  put_all(c, blocks, /*expect_stored=*/false);
  put_all(http, blocks, /*expect_stored=*/false);  // one store behind both doors
  expect_served(c, blocks);
  expect_served(http, blocks);

  auto after = c.lookup("model-a", tokens);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ((*after)["matched_tokens"], 80);
  EXPECT_EQ((*after)["blocks"][4]["tier"], "ram");
  auto other_ns = c.lookup("model-b", tokens);
  EXPECT_EQ((*other_ns)["matched_tokens"], 0) << "namespaces share no blocks";

  std::vector<BlockHash> ask{blocks[3].hash, testing::prompt_blocks(layout, "x", tokens)[0].hash, blocks[0].hash};
  for (KvtierClient* client : {&c, &http}) {
    auto batch = client->batch_get(ask);
    ASSERT_TRUE(batch.ok()) << batch.status().to_string();
    ASSERT_EQ(batch->size(), 3u);
    EXPECT_TRUE((*batch)[0] && *(*batch)[0] == blocks[3].document);
    EXPECT_FALSE((*batch)[1]);
    EXPECT_TRUE((*batch)[2] && *(*batch)[2] == blocks[0].document);
    EXPECT_EQ(client->get(blocks[0].hash, "model-b").status().code(), StatusCode::kNotFound)
        << "a block is not served to another namespace";
  }
  EXPECT_EQ(server->stop(SIGTERM), 0) << server->log();
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ServerDtypeTest, ::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST_F(ServerApiTest, RestartServesTheSameBlocksFromSsd) {
  const std::vector<std::string> args{"--layout", "tiny", "--ssd-cache-dir", ssd()};
  const auto tokens = testing::prompt(2, 4 * 16);
  const auto blocks = testing::prompt_blocks(testing::tiny_layout(DType::kBF16), "m", tokens);
  const std::string first_run = store_and_stop(args, blocks, SIGINT);
  EXPECT_NE(first_run.find("wrote all 4 blocks that only RAM held to the SSD"), std::string::npos) << first_run;
  auto server = start(args);
  KvtierClient c("127.0.0.1", server->port());
  auto found = c.lookup("m", tokens);
  ASSERT_TRUE(found.ok());
  EXPECT_EQ((*found)["matched_tokens"], 64);
  for (const auto& b : (*found)["blocks"]) EXPECT_EQ(b["tier"], "ssd");

  auto warmed = c.prefetch("m", tokens);
  ASSERT_TRUE(warmed.ok()) << warmed.status().to_string();
  EXPECT_EQ((*warmed)["prefetched"], 4);
  EXPECT_EQ((*c.lookup("m", tokens))["blocks"][0]["tier"], "ram");
  expect_served(c, blocks);
  EXPECT_EQ(server->stop(SIGTERM), 0);
}

// /v1/lookup says how long restoring the prefix from each tier below the top would take, from the
// restores this server timed: unknown until it has timed some, then a number an engine can weigh
// against its own prefill.
TEST_F(ServerApiTest, LookupEstimatesTheLoadOfEachLowerTierFromTimedRestores) {
  const std::vector<std::string> args{"--layout", "tiny", "--ssd-cache-dir", ssd()};
  const auto tokens = testing::prompt(3, 16 * 16);
  const auto blocks = testing::prompt_blocks(testing::tiny_layout(DType::kBF16), "m", tokens);
  store_and_stop(args, blocks, SIGTERM);
  auto server = start(args);  // restarted: every block is on the SSD only
  KvtierClient c("127.0.0.1", server->port());
  auto before = c.lookup("m", tokens);
  ASSERT_TRUE(before.ok());
  EXPECT_EQ((*before)["estimated_load"]["ssd"]["blocks"], 16);
  EXPECT_TRUE((*before)["estimated_load"]["ssd"]["seconds"].is_null()) << before->dump();
  std::vector<BlockHash> hashes;
  for (const auto& b : blocks) hashes.push_back(b.hash);
  ASSERT_TRUE(c.batch_get(std::span(hashes).first(2), "m").ok());
  ASSERT_TRUE(c.batch_get(std::span(hashes).subspan(2, 8), "m").ok());
  auto after = c.lookup("m", tokens);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ((*after)["estimated_load"]["ssd"]["blocks"], 6) << after->dump();
  ASSERT_TRUE((*after)["estimated_load"]["ssd"]["seconds"].is_number()) << after->dump();
  EXPECT_GT((*after)["estimated_load"]["ssd"]["seconds"].get<double>(), 0);
  EXPECT_FALSE((*after)["estimated_load"].contains("ram")) << "the top tier costs no load";
  EXPECT_EQ(server->stop(SIGTERM), 0);
}

// --ssd-cache-dir twice: the blocks spread over both directories, a restart serves every one, and
// a directory wiped while the server was down costs only its own blocks (counted in /metrics).
TEST_F(ServerApiTest, TwoSsdDirectoriesServeEveryBlockAndLosingOneLosesOnlyItsBlocks) {
  const std::string a = (dir_ / "nvme0").string(), b = (dir_ / "nvme1").string();
  const std::vector<std::string> args{"--layout", "tiny", "--ssd-cache-dir", a, "--ssd-cache-dir", b,
                                      "--ssd-capacity", "64M", "--ssd-segment-size", "4M"};
  const auto tokens = testing::prompt(3, 40 * 16);
  const auto blocks = testing::prompt_blocks(testing::tiny_layout(DType::kBF16), "m", tokens);
  {
    auto server = start(args);
    KvtierClient c("127.0.0.1", server->port());
    put_all(c, blocks, true);
    EXPECT_EQ(server->stop(SIGINT), 0);
  }
  auto files_in = [](const std::string& dir) {
    size_t n = 0;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir + "/segments")) n += e.is_regular_file();
    return n;
  };
  EXPECT_GE(files_in(a), 1u);
  EXPECT_GE(files_in(b), 1u);
  {
    auto server = start(args);
    KvtierClient c("127.0.0.1", server->port());
    auto found = c.lookup("m", tokens);
    ASSERT_TRUE(found.ok());
    EXPECT_EQ((*found)["matched_tokens"], 40 * 16);
    expect_served(c, blocks);
    const std::string m = *c.metrics();
    EXPECT_NE(m.find("kvtier_ssd_directory_up{dir=\"" + a + "\"} 1"), std::string::npos) << m;
    EXPECT_NE(m.find("kvtier_ssd_directory_up{dir=\"" + b + "\"} 1"), std::string::npos) << m;
    EXPECT_EQ(server->stop(SIGTERM), 0);
  }
  std::filesystem::remove_all(b);
  auto server = start(args);
  KvtierClient c("127.0.0.1", server->port());
  size_t served = 0, missing = 0;
  for (const auto& blk : blocks) {
    auto got = c.get(blk.hash);
    if (got.ok()) {
      ++served;
      EXPECT_TRUE(*got == blk.document) << "block " << blk.hash.hex() << " came back different";
    } else {
      ++missing;
      EXPECT_EQ(got.status().code(), StatusCode::kNotFound) << got.status().to_string();
    }
  }
  EXPECT_GT(served, 0u);
  EXPECT_GT(missing, 0u);
  EXPECT_EQ(served + missing, blocks.size());
  EXPECT_NE(c.metrics()->find("kvtier_ssd_directories_lost_total 1"), std::string::npos);
  EXPECT_NE(server->log().find("holds no data now"), std::string::npos) << server->log();
  EXPECT_EQ(server->stop(SIGTERM), 0);
}

// With --gpu-memory the GPU is the top tier (lavapipe here): PUT uploads, GET downloads, and the
// bytes are the same.
TEST_F(ServerApiTest, GpuTierServesThroughTheApi) {
  auto server = start({"--layout", "tiny", "--gpu-memory", "1M", "--ssd-cache-dir", ssd()});
  KvtierClient c("127.0.0.1", server->port());
  const auto tokens = testing::prompt(7, 3 * 16);
  const auto blocks = testing::prompt_blocks(testing::tiny_layout(DType::kBF16), "m", tokens);
  put_all(c, blocks, true);
  auto found = c.lookup("m", tokens);
  ASSERT_TRUE(found.ok());
  EXPECT_EQ((*found)["matched_tokens"], 48);
  for (const auto& b : (*found)["blocks"]) EXPECT_EQ(b["tier"], "gpu");
  expect_served(c, blocks);
  auto stats = c.stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ((*stats)["tiers"][0]["name"], "gpu");
  EXPECT_EQ((*stats)["tiers"][0]["blocks"], 3);
  EXPECT_EQ(server->stop(SIGTERM), 0) << server->log();
}

// Every bad request gets its status and a JSON error, and the one good block stays as it was.
TEST_F(ServerApiTest, BadRequestsAreRefusedAndChangeNothing) {
  auto server = start({"--layout", "tiny", "--ssd-cache-dir", ssd(), "--api-key", "s3cret"});
  KvtierClient c("127.0.0.1", server->port(), "s3cret");
  const auto layout = testing::tiny_layout(DType::kBF16);
  const auto tokens = testing::prompt(3, 2 * 16);
  const auto blocks = testing::prompt_blocks(layout, "m", tokens);
  put_all(c, {blocks[0]}, true);

  auto expect = [&](int status, const std::string& method, const std::string& path, const std::string& body,
                    std::optional<std::string> auth = std::nullopt) {
    const HttpReply r = c.raw(method, path, body, "application/json", auth);
    EXPECT_EQ(r.status, status) << method << " " << path << ": " << r.body;
    if (status != 200) {
      const json j = json::parse(r.body, nullptr, false);
      EXPECT_TRUE(!j.is_discarded() && j.contains("error")) << method << " " << path << ": " << r.body;
    }
  };
  const std::string good = bytes_str(blocks[0].document);
  const std::string put1 = "/v1/blocks/" + blocks[1].hash.hex();
  // Auth: none, wrong, and /healthz needing none.
  expect(401, "POST", "/v1/lookup", R"({"namespace":"m","tokens":[1]})", std::string(""));
  expect(401, "POST", "/v1/lookup", R"({"namespace":"m","tokens":[1]})", std::string("Bearer s3cre"));
  expect(401, "GET", "/metrics", "", std::string("Bearer s3cret0"));
  expect(200, "GET", "/healthz", "", std::string(""));
  // Malformed control bodies.
  expect(400, "POST", "/v1/lookup", "{\"namespace\": \"m\", \"tokens\": [1,", std::nullopt);
  expect(400, "POST", "/v1/lookup", R"({"namespace":"m"})", std::nullopt);
  expect(400, "POST", "/v1/lookup", R"({"namespace":"m","tokens":[-1]})", std::nullopt);
  expect(400, "POST", "/v1/lookup", R"({"namespace":"m","tokens":[1],"tokns":[]})", std::nullopt);
  expect(400, "POST", "/v1/blocks:batchGet", R"({"hashes":["zz"]})", std::nullopt);
  json too_many{{"hashes", std::vector<std::string>(65537, blocks[0].hash.hex())}};
  expect(400, "POST", "/v1/blocks:batchGet", too_many.dump(), std::nullopt);
  // Block bodies: another block's hash, a bad hash, a forged token, another layout, cut short, too big.
  expect(422, "PUT", put1, good, std::nullopt);
  expect(400, "PUT", "/v1/blocks/not-hex", good, std::nullopt);
  std::string forged = good;
  const size_t at = forged.find("\"token_ids\":\"") + 13;
  forged[at] = forged[at] == '9' ? '8' : '9';
  expect(422, "PUT", "/v1/blocks/" + blocks[0].hash.hex(), forged, std::nullopt);
  const auto f32 = testing::prompt_blocks(testing::tiny_layout(DType::kF32), "m", tokens);
  expect(422, "PUT", "/v1/blocks/" + f32[1].hash.hex(), bytes_str(f32[1].document), std::nullopt);
  expect(400, "PUT", put1, bytes_str(blocks[1].document).substr(0, blocks[1].document.size() - 100), std::nullopt);
  expect(400, "PUT", put1, "", std::nullopt);
  expect(413, "PUT", put1, std::string(layout->dense_block_bytes() + (16u << 20) + 1, 'x'), std::nullopt);
  // Routes and misses.
  expect(404, "GET", "/v1/nothing", "", std::nullopt);
  expect(404, "GET", put1, "", std::nullopt);
  expect(404, "DELETE", put1, "", std::nullopt);

  auto stats = c.stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ((*stats)["tiers"][0]["blocks"], 1) << "a refused request stored something";
  const auto& puts = (*stats)["metrics"]["kvtier_server_puts_total"];
  uint64_t rejected = 0;
  for (const auto& p : puts) {
    if (p["labels"]["outcome"].get<std::string>().rfind("rejected", 0) == 0) rejected += p["value"].get<uint64_t>();
  }
  EXPECT_EQ(rejected, 5u) << "every refused PUT that reached the handler is counted";
  expect_served(c, {blocks[0]});
  EXPECT_EQ(server->stop(SIGTERM), 0);
}

TEST_F(ServerApiTest, JsonRoutesTakeJsonWhateverTheContentTypeSays) {
  // `curl -d` sends application/x-www-form-urlencoded; a 128k-token lookup is ~900 KB of JSON.
  auto server = start({"--layout", "tiny"});
  KvtierClient c("127.0.0.1", server->port());
  nlohmann::json body{{"namespace", "curl"}, {"tokens", testing::prompt(9, 128 * 1024)}};
  for (const char* type : {"application/x-www-form-urlencoded", "text/plain", ""}) {
    const HttpReply r = c.raw("POST", "/v1/lookup", body.dump(), type);
    EXPECT_EQ(r.status, 200) << type << ": " << r.body;
    auto j = nlohmann::json::parse(r.body, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << type;
    EXPECT_EQ(j["matched_tokens"], 0);
    EXPECT_EQ(j["missing"].size(), 8192u);
  }
}

TEST_F(ServerApiTest, ConcurrentPutsOfOneBlockStoreItOnce) {
  auto server = start({"--layout", "tiny"});
  const auto blocks = testing::prompt_blocks(testing::tiny_layout(DType::kBF16), "m", testing::prompt(4, 16));
  std::atomic<int> stored{0}, present{0}, failed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 16; ++t) {
    threads.emplace_back([&] {
      KvtierClient c("127.0.0.1", server->port());
      auto r = c.put(blocks[0].hash, blocks[0].document);
      if (!r.ok()) ADD_FAILURE() << r.status().to_string();
      (!r.ok() ? failed : *r ? stored : present)++;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(stored.load(), 1);
  EXPECT_EQ(present.load(), 15);
  EXPECT_EQ(failed.load(), 0);
}

TEST_F(ServerApiTest, MetricsAreOnePrometheusFamilyPerName) {
  auto server = start({"--layout", "tiny", "--ssd-cache-dir", ssd()});
  KvtierClient c("127.0.0.1", server->port());
  c.use_binary(false);
  const auto blocks = testing::prompt_blocks(testing::tiny_layout(DType::kBF16), "m", testing::prompt(5, 32));
  put_all(c, blocks, true);
  KvtierClient binary("127.0.0.1", server->port());
  ASSERT_TRUE(binary.binary_in_use());
  put_all(binary, blocks, false);
  auto text = c.metrics();
  ASSERT_TRUE(text.ok());
  std::map<std::string, int> types;
  std::istringstream in(*text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("# TYPE ", 0) == 0) ++types[line.substr(7, line.find(' ', 7) - 7)];
  }
  for (const auto& [name, n] : types) EXPECT_EQ(n, 1) << name << " is declared " << n << " times";
  EXPECT_NE(text->find("kvtier_http_requests_total{route=\"put_block\",code=\"201\"} 2"), std::string::npos);
  EXPECT_NE(text->find("kvtier_tier_inserts_total{tier=\"ram\"} 2"), std::string::npos);
  EXPECT_NE(text->find("kvtier_http_request_seconds_bucket{route=\"put_block\",le=\"+Inf\"} 2"), std::string::npos);
  EXPECT_NE(text->find("kvtier_wire_requests_total{op=\"put\",code=\"200\"} 2"), std::string::npos) << *text;
  EXPECT_NE(text->find("kvtier_wire_connections_total 1"), std::string::npos) << *text;
  EXPECT_TRUE(types.count("kvtier_ssd_used_bytes") || types.count("kvtier_ssd_segments")) << *text;
}

TEST_F(ServerApiTest, CommandLineClientPutsAndGets) {
  auto server = start({"--layout", "tiny"});
  const auto blocks = testing::prompt_blocks(testing::tiny_layout(DType::kBF16), "m", testing::prompt(6, 16));
  const std::string in = (dir_ / "in.safetensors").string(), out = (dir_ / "out.safetensors").string();
  std::ofstream(in, std::ios::binary).write(reinterpret_cast<const char*>(blocks[0].document.data()),
                                            static_cast<std::streamsize>(blocks[0].document.size()));
  const std::string port = std::to_string(server->port()), log = (dir_ / "cli.log").string();
  auto put = testing::run_program({KVTIER_CLI_PATH, "--port", port, "put", in}, log);
  EXPECT_EQ(put.exit_code, 0) << put.output;
  EXPECT_NE(put.output.find("stored " + blocks[0].hash.hex()), std::string::npos) << put.output;
  auto get = testing::run_program({KVTIER_CLI_PATH, "--port", port, "get", blocks[0].hash.hex(), "-o", out}, log);
  EXPECT_EQ(get.exit_code, 0) << get.output;
  std::ifstream f(out, std::ios::binary);
  const std::string back((std::istreambuf_iterator<char>(f)), {});
  EXPECT_TRUE(back == bytes_str(blocks[0].document));
  auto miss = testing::run_program({KVTIER_CLI_PATH, "--port", port, "get", std::string(64, 'a')}, log);
  EXPECT_EQ(miss.exit_code, 1);
  EXPECT_NE(miss.output.find("HTTP 404"), std::string::npos) << miss.output;
}

TEST_F(ServerApiTest, PythonClientExampleStoresAndFetchesABlock) {
  auto server = start({"--layout", "tiny"});
  auto run = testing::run_program({"/usr/bin/python3", KVTIER_SOURCE_DIR "/clients/python/example.py", "--port",
                                   std::to_string(server->port())},
                                  (dir_ / "python.log").string());
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("round trip ok"), std::string::npos) << run.output;
}

TEST_F(ServerApiTest, BadSettingsFailBeforeAnythingStarts) {
  const std::string log = (dir_ / "bad.log").string();
  auto bad_size = testing::run_program({KVTIER_KVTIERD_PATH, "--ram-capacity", "12Q"}, log);
  EXPECT_EQ(bad_size.exit_code, 2);
  EXPECT_NE(bad_size.output.find("--ram-capacity"), std::string::npos) << bad_size.output;
  auto bad_layout = testing::run_program({KVTIER_KVTIERD_PATH, "--layout", "no-such-model"}, log);
  EXPECT_EQ(bad_layout.exit_code, 2);
  // A second server on a directory in use is refused, and the first keeps serving.
  auto first = start({"--layout", "tiny", "--ssd-cache-dir", ssd()});
  auto second = testing::run_program({KVTIER_KVTIERD_PATH, "--port", "0", "--layout", "tiny", "--ssd-cache-dir", ssd()}, log);
  EXPECT_EQ(second.exit_code, 1);
  EXPECT_NE(second.output.find("in use by another process"), std::string::npos) << second.output;
  KvtierClient c("127.0.0.1", first->port());
  EXPECT_TRUE(c.healthz().ok());
}

}  // namespace
}  // namespace kvtier

namespace kvtier {
namespace {

// --log-format json: every line kvtierd writes is one JSON object, also when a refusal quotes
// a client's JSON and bytes that are not UTF-8.
TEST_F(ServerApiTest, JsonLogFormatWritesOneObjectPerLine) {
  auto server = start({"--layout", "tiny", "--log-format", "json", "--log-level", "info"});
  KvtierClient c("127.0.0.1", server->port());
  const HttpReply bad = c.raw("POST", "/v1/lookup", "{\"namespace\": \"q\\\"uote\xff\", \"tokens\": [1,");
  EXPECT_EQ(bad.status, 400);
  const auto blocks = testing::prompt_blocks(testing::tiny_layout(DType::kBF16), "m", testing::prompt(3, 32));
  EXPECT_FALSE(c.put(blocks[1].hash, blocks[0].document).ok());  // a refusal, logged with its reason
  EXPECT_EQ(server->stop(SIGTERM), 0);
  std::istringstream lines(server->log());
  int parsed = 0, warnings = 0;
  for (std::string line; std::getline(lines, line);) {
    const json j = json::parse(line, nullptr, false);
    ASSERT_TRUE(j.is_object()) << "not a JSON object: " << line;
    ASSERT_TRUE(j.contains("msg")) << line;
    ++parsed;
    warnings += j.value("level", "") == "warning";
  }
  EXPECT_GE(parsed, 4);
  EXPECT_GE(warnings, 2) << server->log();
}

}  // namespace
}  // namespace kvtier

namespace kvtier {
namespace {

// docs/metrics.md lists every family a kvtierd with every local tier and both doors exports.
TEST_F(ServerApiTest, DocsListEveryMetricFamily) {
  auto server = start({"--layout", "tiny", "--ssd-cache-dir", ssd(), "--gpu-memory", "1M",
                       "--ssd-write-budget", "1T/day"});
  KvtierClient c("127.0.0.1", server->port());
  const auto blocks = testing::prompt_blocks(testing::tiny_layout(DType::kBF16), "m", testing::prompt(4, 32));
  put_all(c, blocks, true);
  auto text = c.metrics();
  ASSERT_TRUE(text.ok());
  EXPECT_NE(text->find("kvtier_ssd_write_budget_bytes_per_day 1099511627776"), std::string::npos)
      << "the budget is on and shown";
  ASSERT_TRUE(text.ok());
  std::ifstream in(std::string(KVTIER_SOURCE_DIR) + "/docs/metrics.md");
  const std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_FALSE(doc.empty());
  std::istringstream lines(*text);
  int families = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("# TYPE ", 0) != 0) continue;
    const std::string name = line.substr(7, line.find(' ', 7) - 7);
    ++families;
    EXPECT_NE(doc.find("`" + name + "`"), std::string::npos) << name << " is not in docs/metrics.md";
  }
  EXPECT_GT(families, 80);
  EXPECT_EQ(server->stop(SIGTERM), 0);
}

}  // namespace
}  // namespace kvtier
