// kvtierd's promises about what it holds, tried as a careless or hostile client would: what a
// shutdown onto a full disk says it wrote is what a restart serves, and it says what it lost;
// a DELETE stays done while prefetches race it; a JSON body is refused from its header when it is
// too long and costs no more than the body budget when it is legal; a key with one namespace may
// leave it out on every route.
#include <signal.h>
#include <sys/mount.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "server/cli/kvtier_client.h"
#include "tests/server/raw_requests.h"
#include "tests/server/server_process.h"
#include "tests/server/wire_blocks.h"

namespace kvtier {
namespace {

using nlohmann::json;
using testing::metric_value;
using testing::raw_http;

// The largest body kvtierd takes for the tiny layout: one 16 KiB block plus 16 MiB.
constexpr uint64_t kMaxTinyBody = 16'793'600;

class ServerDurabilityTest : public testing::ServerFixture {
 protected:
  static size_t served(KvtierClient& c, const std::vector<testing::WireBlock>& blocks) {
    size_t n = 0;
    for (const auto& b : blocks) {
      auto got = c.get(b.hash, "m");
      if (!got.ok()) continue;
      EXPECT_EQ(*got, b.document) << "a block served back differs from the one PUT";
      ++n;
    }
    return n;
  }
};

TEST_F(ServerDurabilityTest, AShutdownOntoAFullDiskSaysWhatItLostAndARestartServesWhatItSaysItWrote) {
  const std::string disk = (dir_ / "small").string();
  std::filesystem::create_directories(disk);
  if (::mount("kvtier-test", disk.c_str(), "tmpfs", 0, "size=8388608") != 0) {
    GTEST_SKIP() << "cannot mount a small tmpfs here: the full disk is not exercised";
  }
  struct Unmount {
    std::string at;
    ~Unmount() { ::umount2(at.c_str(), MNT_DETACH); }
  } unmount{disk};
  const std::vector<std::string> args{"--ssd-cache-dir", disk + "/ssd", "--ssd-capacity", "64M",
                                      "--ssd-segment-size", "2M", "--ram-capacity", "64M"};
  const auto blocks = testing::prompt_blocks(testing::tiny_layout(DType::kBF16), "m", testing::prompt(1, 800 * 16));
  auto first = start(args);
  {
    KvtierClient c("127.0.0.1", first->port());
    for (const auto& b : blocks) ASSERT_TRUE(c.put(b.hash, b.document, "m").ok());
  }
  EXPECT_EQ(first->stop(SIGTERM), 3) << "a shutdown that lost blocks exits 3\n" << first->log();
  const std::string log = first->log();
  size_t written = 0, of = 0, lost = 0;
  const size_t at = log.find("shutdown: wrote ");
  ASSERT_NE(at, std::string::npos) << log;
  ASSERT_EQ(std::sscanf(log.c_str() + at, "shutdown: wrote %zu of the %zu blocks that only RAM held to the SSD; %zu are lost",
                        &written, &of, &lost), 3)
      << log.substr(at, 200);
  EXPECT_EQ(of, blocks.size());
  EXPECT_EQ(written + lost, blocks.size());
  EXPECT_GT(lost, 0u) << "8 MiB cannot hold 800 blocks of 16 KiB";
  EXPECT_GT(written, 0u);
  auto second = start(args);
  KvtierClient c("127.0.0.1", second->port());
  const size_t back = served(c, blocks);
  EXPECT_EQ(back, written) << "what the shutdown said it wrote, and nothing more, comes back";
  std::printf("an 8 MiB disk at SIGTERM: wrote %zu of %zu blocks, %zu lost; %zu served after the restart\n", written,
              of, lost, back);
  EXPECT_EQ(second->stop(SIGTERM), 0) << second->log();
}

// An SSD smaller than what RAM holds cannot keep it all: the shutdown says how many it lost and
// why, and what stays is each prompt's start (written last, so reclaimed last), which a lookup
// can use, not a scatter of later blocks that match nothing.
TEST_F(ServerDurabilityTest, AShutdownOntoASmallerSsdKeepsThePromptsFirstBlocksAndSaysWhy) {
  const std::vector<std::string> args{"--ssd-cache-dir",    (dir_ / "ssd").string(),
                                      "--ssd-capacity",     "15M",
                                      "--ssd-segment-size", "5M",
                                      "--ram-capacity",     "64M"};
  const auto tokens = testing::prompt(3, 1600 * 16);
  const auto blocks = testing::prompt_blocks(testing::tiny_layout(DType::kBF16), "m", tokens);
  auto first = start(args);
  {
    KvtierClient c("127.0.0.1", first->port());
    for (const auto& b : blocks) ASSERT_TRUE(c.put(b.hash, b.document, "m").ok());
  }
  EXPECT_EQ(first->stop(SIGTERM), 3) << "15 MiB cannot keep 1600 blocks of 16 KiB\n"
                                     << first->log();
  const std::string log = first->log();
  const size_t at = log.find("shutdown: wrote ");
  ASSERT_NE(at, std::string::npos) << log;
  const std::string line = log.substr(at, log.find('\n', at) - at);
  size_t written = 0, of = 0, lost = 0;
  ASSERT_EQ(std::sscanf(
                line.c_str(),
                "shutdown: wrote %zu of the %zu blocks that only RAM held to the SSD; %zu are lost",
                &written, &of, &lost),
            3)
      << line;
  EXPECT_EQ(of, blocks.size());
  EXPECT_GT(written, 0u);
  EXPECT_NE(line.find("reclaimed for room"), std::string::npos) << "the reason is given: " << line;
  std::printf("%s\n", line.c_str());
  auto second = start(args);
  KvtierClient c("127.0.0.1", second->port());
  EXPECT_EQ(served(c, blocks), written)
      << "what the shutdown said it wrote, and nothing more, comes back";
  auto matched = c.lookup("m", tokens);
  ASSERT_TRUE(matched.ok());
  EXPECT_EQ((*matched)["matched_tokens"].get<size_t>(), written * 16)
      << "the blocks kept are the prompt's first ones, so all of them serve a lookup";
  EXPECT_EQ(second->stop(SIGTERM), 0) << second->log();
}

TEST_F(ServerDurabilityTest, DeletedBlocksStayDeletedWhilePrefetchesRaceTheDelete) {
  const std::string ssd = (dir_ / "ssd").string();
  const std::vector<std::string> args{"--ssd-cache-dir", ssd};
  const auto tokens = testing::prompt(5, 48 * 16);
  const auto blocks = testing::prompt_blocks(testing::tiny_layout(DType::kBF16), "m", tokens);
  size_t resurrected = 0;
  for (int round = 0; round < 5; ++round) {
    {
      auto s = start(args);
      KvtierClient c("127.0.0.1", s->port());
      for (const auto& b : blocks) ASSERT_TRUE(c.put(b.hash, b.document, "m").ok());
      ASSERT_EQ(s->stop(SIGTERM), 0) << s->log();  // restarted below: every block on the SSD only
    }
    auto server = start(args);
    std::atomic<bool> stop{false};
    std::vector<std::thread> prefetchers;
    for (int p = 0; p < 3; ++p) {
      prefetchers.emplace_back([&] {
        KvtierClient c("127.0.0.1", server->port());
        while (!stop.load()) (void)c.prefetch("m", tokens);
      });
    }
    KvtierClient c("127.0.0.1", server->port());
    for (const auto& b : blocks) EXPECT_TRUE(c.erase(b.hash, "m").ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    stop = true;
    for (auto& t : prefetchers) t.join();
    resurrected += served(c, blocks);
    EXPECT_EQ((*c.lookup("m", tokens))["matched_tokens"], 0);
    ASSERT_EQ(server->stop(SIGTERM), 0) << server->log();
    auto again = start(args);
    KvtierClient after("127.0.0.1", again->port());
    resurrected += served(after, blocks);
    ASSERT_EQ(again->stop(SIGTERM), 0) << again->log();
  }
  EXPECT_EQ(resurrected, 0u) << "deleted blocks served again, before or after a restart";
}

// The server's RSS grew by no more than `budget` and what its threads and heap touch besides.
// Under ASan its shadow memory and freed-memory quarantine are RSS too: the metrics hold there.
void expect_within_budget(size_t before, size_t after, uint64_t budget) {
#if !defined(__SANITIZE_ADDRESS__)
  EXPECT_LT(after, before + budget + (32ull << 20)) << "RSS " << before / 1048576 << " -> " << after / 1048576 << " MiB";
#else
  (void)before, (void)after, (void)budget;
#endif
}

std::string post(const std::string& route, const std::string& length, const std::string& body) {
  return "POST " + route + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " + length +
         "\r\n\r\n" + body;
}

TEST_F(ServerDurabilityTest, AJsonBodyPastTheLimitIsA413FromItsHeaderWithTheBodyUnread) {
  auto server = start({"--request-timeout", "30"});
  for (const char* route : {"/v1/lookup", "/v1/prefetch", "/v1/blocks:batchGet"}) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto r = raw_http(server->port(), post(route, std::to_string(1ull << 40), ""), 20);
    EXPECT_EQ(r.status, 413) << route << ": " << r.text;
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5)) << "answered without waiting for a body";
  }
  // One byte past the limit, sent whole: 413, not "not valid JSON".
  const std::string body = R"({"tokens":[)" + std::string(kMaxTinyBody - 12, ' ') + "]}";
  ASSERT_EQ(body.size(), kMaxTinyBody + 1);
  const auto r = raw_http(server->port(), post("/v1/lookup", std::to_string(body.size()), body), 30);
  EXPECT_EQ(r.status, 413) << r.text.substr(0, 300);
  KvtierClient c("127.0.0.1", server->port());
  EXPECT_TRUE(c.healthz().ok());
  EXPECT_EQ(server->stop(SIGTERM), 0) << server->log();
}

TEST_F(ServerDurabilityTest, LookupBodiesOfMillionsOfTokensAreRefusedAsTheyAreReadWithinTheBudget) {
  constexpr uint64_t kBudget = 96ull << 20;
  auto server = start({"--max-body-memory", "96M"});
  const size_t before = server->rss_bytes();
  // 16 MiB of "1,": 8.4M tokens, within the body limit, past the token limit: refused as it is
  // parsed, before it becomes an array (parsed whole, one took RSS from 24 to 765 MiB).
  std::string many = R"({"namespace":"m","tokens":[)";
  while (many.size() < kMaxTinyBody - 16) many += "1,";
  many += "1]}";
  std::vector<std::thread> clients;
  std::atomic<int> refused{0};
  for (int i = 0; i < 4; ++i) {
    clients.emplace_back([&] {
      const auto r = raw_http(server->port(), post("/v1/lookup", std::to_string(many.size()), many), 60);
      if (r.status == 413 && r.text.find("1048576 tokens") != std::string::npos) refused.fetch_add(1);
      else ADD_FAILURE() << r.text.substr(0, 300);
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(refused.load(), 4) << "96M holds four 16 MiB bodies at once";
  expect_within_budget(before, server->rss_bytes(), kBudget);
  KvtierClient c("127.0.0.1", server->port());
  EXPECT_EQ(metric_value(c, "kvtier_server_body_bytes_held"), 0.0) << "every lease given back";
  EXPECT_EQ(server->stop(SIGTERM), 0) << server->log();
}

// 1M tokens ("7,7,..."): the most a lookup may name. Its tokens and its reply are taken from the
// budget with its 2 MiB body: answered within 96M, told to retry within the smallest budget.
std::string largest_lookup() {
  std::string legal = R"({"namespace":"m","tokens":[)";
  for (int i = 0; i < (1 << 20) - 1; ++i) legal += "7,";
  return legal + "7]}";
}

TEST_F(ServerDurabilityTest, TheLargestLegalLookupIsAnsweredWithinTheBudget) {
  constexpr uint64_t kBudget = 96ull << 20;
  auto server = start({"--max-body-memory", "96M"});
  const size_t before = server->rss_bytes();
  const std::string legal = largest_lookup();
  const auto r = raw_http(server->port(), post("/v1/lookup", std::to_string(legal.size()), legal), 60);
  EXPECT_EQ(r.status, 200) << r.text.substr(0, 300);
  expect_within_budget(before, server->rss_bytes(), kBudget);
  EXPECT_EQ(server->stop(SIGTERM), 0) << server->log();
  auto small = start({"--max-body-memory", "17M"});
  const auto refused = raw_http(small->port(), post("/v1/lookup", std::to_string(legal.size()), legal), 60);
  EXPECT_EQ(refused.status, 503) << "its tokens and reply do not fit 17M: " << refused.text.substr(0, 300);
  EXPECT_EQ(small->stop(SIGTERM), 0) << small->log();
}

TEST_F(ServerDurabilityTest, AKeyWithOneNamespaceMayLeaveItOutOfLookupAndPrefetch) {
  const std::string keys = (dir_ / "keys.json").string();
  std::ofstream(keys) << json{{"keys", {{{"tenant", "q"}, {"key", "key-q-0123456789abcdef"}, {"namespaces", {"qwen"}}}}}}.dump();
  auto server = start({"--api-keys", keys});
  KvtierClient c("127.0.0.1", server->port(), "key-q-0123456789abcdef");
  for (const char* route : {"/v1/lookup", "/v1/prefetch"}) {
    const auto r = c.raw("POST", route, json{{"tokens", testing::prompt(9, 32)}}.dump());
    EXPECT_EQ(r.status, 200) << route << ": " << r.body;
    EXPECT_EQ(json::parse(r.body, nullptr, false).value("matched_tokens", -1), 0) << r.body;
  }
  EXPECT_EQ(server->stop(SIGTERM), 0) << server->log();
  // Without keys there is no namespace to default to: the field is named.
  auto open = start({});
  KvtierClient anyone("127.0.0.1", open->port());
  const auto r = anyone.raw("POST", "/v1/lookup", json{{"tokens", testing::prompt(9, 32)}}.dump());
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("missing field 'namespace'"), std::string::npos) << r.body;
  EXPECT_EQ(open->stop(SIGTERM), 0) << open->log();
}

}  // namespace
}  // namespace kvtier
