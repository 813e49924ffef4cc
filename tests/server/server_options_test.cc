// kvtierd's settings: flags, a --config file under them, and every bad value refused with a
// message that names the flag, before anything starts.
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "server/server_options.h"
#include "tests/support/temp_dir.h"

namespace kvtier {
namespace {

struct Parsed {
  ParsedCommandLine cl;
  std::string out, err;
};

Parsed parse(std::vector<std::string> args) {
  args.insert(args.begin(), "kvtierd");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  std::ostringstream out, err;
  Parsed p{parse_server_command_line(static_cast<int>(argv.size()), argv.data(), out, err), "", ""};
  p.out = out.str();
  p.err = err.str();
  return p;
}

TEST(ServerOptionsTest, DefaultsListenOnLoopbackWithoutAnSsdTier) {
  auto p = parse({});
  ASSERT_TRUE(p.cl.options) << p.err;
  EXPECT_EQ(p.cl.options->host, "127.0.0.1");
  EXPECT_EQ(p.cl.options->port, 8417);
  EXPECT_TRUE(p.cl.options->ssd_cache_dirs.empty());
  EXPECT_FALSE(cache_stack_options(*p.cl.options).ssd.has_value());
  EXPECT_EQ(p.cl.options->resolved_layout->name, "llama-3-8b");
}

TEST(ServerOptionsTest, SsdCacheDirTurnsTheSsdTierOnWithItsSettings) {
  auto p = parse({"--ssd-cache-dir", "/tmp/x", "--ssd-capacity", "8G", "--ram-capacity", "512M",
                  "--compression", "lz4", "--kv-cache-quantization", "4", "--hash", "xxh3"});
  ASSERT_TRUE(p.cl.options) << p.err;
  const CacheStackOptions c = cache_stack_options(*p.cl.options);
  ASSERT_TRUE(c.ssd.has_value());
  EXPECT_EQ(c.ssd->dir, "/tmp/x");
  EXPECT_EQ(c.ssd->capacity_bytes, 8ull << 30);
  EXPECT_EQ(c.ssd->codec, FrameCodec::kLz4);
  EXPECT_EQ(c.ram.capacity_bytes, 512ull << 20);
  ASSERT_TRUE(c.ram.quantization.has_value());
  EXPECT_EQ(c.ram.quantization->bits, 4);
  EXPECT_EQ(p.cl.options->hash, HashAlgorithm::kXxh3);
}

TEST(ServerOptionsTest, AnSsdWriteBudgetIsBytesADay) {
  for (const char* budget : {"2T/day", "2T/d", "2T"}) {
    auto p = parse({"--ssd-cache-dir", "/tmp/x", "--ssd-write-budget", budget});
    ASSERT_TRUE(p.cl.options) << p.err;
    EXPECT_EQ(cache_stack_options(*p.cl.options).ssd_write_budget, 2ull << 40) << budget;
  }
  auto none = parse({"--ssd-cache-dir", "/tmp/x"});
  ASSERT_TRUE(none.cl.options) << none.err;
  EXPECT_EQ(cache_stack_options(*none.cl.options).ssd_write_budget, 0u);
}

TEST(ServerOptionsTest, SeveralSsdCacheDirsStripeTheTierAndSplitItsCapacity) {
  for (const auto& args : {std::vector<std::string>{"--ssd-cache-dir", "/nvme0/kv", "--ssd-cache-dir", "/nvme1/kv"},
                           std::vector<std::string>{"--ssd-cache-dir", "/nvme0/kv,/nvme1/kv"}}) {
    auto with = args;
    with.insert(with.end(), {"--ssd-capacity", "8G"});
    auto p = parse(with);
    ASSERT_TRUE(p.cl.options) << p.err;
    const CacheStackOptions c = cache_stack_options(*p.cl.options);
    ASSERT_TRUE(c.ssd.has_value());
    EXPECT_EQ(c.ssd->dirs, (std::vector<std::string>{"/nvme0/kv", "/nvme1/kv"}));
    EXPECT_EQ(c.ssd->capacity_bytes, 8ull << 30);
  }
  // Two segments per directory at least.
  auto small = parse({"--ssd-cache-dir", "/a,/b", "--ssd-capacity", "768M"});
  EXPECT_FALSE(small.cl.options);
  EXPECT_NE(small.err.find("per directory (2 given)"), std::string::npos) << small.err;
  // A config file may list them; the command line replaces the list.
  testing::TempDir dir;
  const std::string path = (dir / "kvtierd.json").string();
  std::ofstream(path) << R"({"ssd-cache-dir": ["/nvme0/kv", "/nvme1/kv"]})";
  auto from_file = parse({"--config", path});
  ASSERT_TRUE(from_file.cl.options) << from_file.err;
  EXPECT_EQ(from_file.cl.options->ssd_cache_dirs, (std::vector<std::string>{"/nvme0/kv", "/nvme1/kv"}));
  auto replaced = parse({"--config", path, "--ssd-cache-dir", "/other"});
  ASSERT_TRUE(replaced.cl.options) << replaced.err;
  EXPECT_EQ(replaced.cl.options->ssd_cache_dirs, std::vector<std::string>{"/other"});
}

TEST(ServerOptionsTest, ConfigFileSetsTheSameKeysAndFlagsWin) {
  testing::TempDir dir;
  const std::string path = (dir / "kvtierd.json").string();
  std::ofstream(path) << R"({"port": 9000, "ram_capacity": "2G", "ssd-cache-dir": "/data/kv", "ssd-reset": true,
                            "log-level": "debug"})";
  auto p = parse({"--config", path, "--port", "9001"});
  ASSERT_TRUE(p.cl.options) << p.err;
  EXPECT_EQ(p.cl.options->port, 9001);
  EXPECT_EQ(p.cl.options->ram_capacity, 2ull << 30);
  EXPECT_EQ(p.cl.options->ssd_cache_dirs, std::vector<std::string>{"/data/kv"});
  EXPECT_TRUE(p.cl.options->ssd_reset);
  EXPECT_EQ(p.cl.options->log_level, "debug");

  std::ofstream(path) << R"({"prot": 9000})";
  auto typo = parse({"--config", path});
  EXPECT_FALSE(typo.cl.options);
  EXPECT_EQ(typo.cl.exit_code, 2);
  EXPECT_NE(typo.err.find("unknown key 'prot'"), std::string::npos) << typo.err;
  EXPECT_EQ(parse({"--config", (dir / "missing.json").string()}).cl.exit_code, 2);
}

TEST(ServerOptionsTest, BadValuesNameTheirFlag) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--ram-capacity", "lots"}, "--ram-capacity"},
      {{"--ram-capacity", "1K"}, "--ram-capacity"},  // fewer than two blocks
      {{"--ssd-capacity", "1X", "--ssd-cache-dir", "d"}, "--ssd-capacity"},
      {{"--ssd-capacity", "300M", "--ssd-cache-dir", "d"}, "--ssd-capacity"},  // < 2 segments
      {{"--gpu-memory", "-1"}, "--gpu-memory"},
      {{"--hash", "md5"}, "--hash"},
      {{"--compression", "zstd"}, "--compression"},
      {{"--kv-cache-quantization", "3"}, "--kv-cache-quantization"},
      {{"--log-level", "loud"}, "--log-level"},
      {{"--layout", "gpt-9"}, "--layout"},
      {{"--port", "70000"}, "--port"},
      {{"--threads", "0"}, "--threads"},
      {{"--idle-timeout", "0"}, "--idle-timeout"},
      {{"--binary-port", "x"}, "--binary-port"},
      {{"--max-connections-per-client", "0"}, "--max-connections-per-client"},
      {{"--log-format", "xml"}, "--log-format"},
      {{"--ssd-write-budget", "2T/week", "--ssd-cache-dir", "d"}, "--ssd-write-budget"},
      {{"--ssd-write-budget", "lots", "--ssd-cache-dir", "d"}, "--ssd-write-budget"},
      {{"--ssd-write-budget", "0", "--ssd-cache-dir", "d"}, "--ssd-write-budget"},
      {{"--ssd-write-budget", "2T/day"}, "--ssd-write-budget"},  // no SSD tier to budget
  };
  for (const auto& [args, flag] : cases) {
    auto p = parse(args);
    EXPECT_FALSE(p.cl.options) << args[0] << " " << args[1];
    EXPECT_EQ(p.cl.exit_code, 2);
    EXPECT_NE(p.err.find(flag), std::string::npos) << p.err;
  }
}

TEST(ServerOptionsTest, HelpListsTheFlagsAndExitsZero) {
  auto p = parse({"--help"});
  EXPECT_FALSE(p.cl.options);
  EXPECT_EQ(p.cl.exit_code, 0);
  EXPECT_NE(p.out.find("--ssd-cache-dir"), std::string::npos);
  EXPECT_NE(p.out.find("--api-key"), std::string::npos);
}

}  // namespace
}  // namespace kvtier
