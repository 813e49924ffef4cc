// kvtier-fsck as an operator runs it on the directory a stopped kvtierd left: it reports every
// record intact, and while it checks it says how far it has come, on stderr, where a log or a
// systemd journal (no terminal) shows it as lines.
#include <signal.h>

#include <gtest/gtest.h>

#include "server/cli/kvtier_client.h"
#include "tests/server/server_process.h"
#include "tests/server/wire_blocks.h"
#include "tests/support/temp_dir.h"

namespace kvtier {
namespace {

TEST(FsckCommandTest, ChecksAStoppedServersDirectoryAndShowsProgressLines) {
  testing::TempDir dir;
  const std::string ssd = (dir / "ssd").string();
  {
    testing::ServerProcess server((dir / "kvtierd.log").string(), {"--layout", "tiny", "--ssd-cache-dir", ssd});
    ASSERT_GT(server.port(), 0) << server.log();
    KvtierClient c("127.0.0.1", server.port());
    const auto blocks = testing::prompt_blocks(testing::tiny_layout(DType::kBF16), "m", testing::prompt(31, 200 * 16));
    for (const auto& b : blocks) ASSERT_TRUE(c.put(b.hash, b.document, "m").ok());
    ASSERT_EQ(server.stop(SIGTERM), 0) << server.log();  // writes what only RAM held to the SSD
  }
  const auto run = testing::run_program({KVTIER_FSCK_PATH, ssd, "--progress-every", "0"}, (dir / "fsck.log").string());
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("entries         200"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("ok              200"), std::string::npos) << run.output;
  // One line per 64 entries checked, then the last: 0, 64, 128, 192 and 200 of 200.
  size_t lines = 0;
  for (size_t at = run.output.find("kvtier-fsck: "); at != std::string::npos; at = run.output.find("kvtier-fsck: ", at + 1)) {
    ++lines;
  }
  EXPECT_EQ(lines, 5u) << run.output;
  EXPECT_NE(run.output.find("64/200 entries"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("100.0%  200/200 entries"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("GB/s"), std::string::npos) << run.output;

  const auto quiet = testing::run_program({KVTIER_FSCK_PATH, ssd, "-q"}, (dir / "quiet.log").string());
  EXPECT_EQ(quiet.exit_code, 0) << quiet.output;
  EXPECT_EQ(quiet.output.find("kvtier-fsck: "), std::string::npos) << "-q shows no progress";
}

}  // namespace
}  // namespace kvtier
