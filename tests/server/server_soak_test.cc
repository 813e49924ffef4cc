// A crash-and-fault soak of one kvtierd (bounded: KVTIER_SOAK_SECONDS, 45 by default): writers,
// readers, deleters, prefetchers and lookups at once on a small RAM tier over an SSD on a small
// file system, the server killed with SIGKILL (now and then stopped with SIGTERM) and restarted
// in a loop, the disk let fill up every fourth round. What it must never do, whatever was in
// flight: serve a byte other than what was PUT, or serve (or match) a block after its DELETE was
// answered. Everything else (a block lost to a kill or a full disk) is a counted miss. The
// figures are printed at the end.
#include <signal.h>
#include <sys/mount.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "server/cli/kvtier_client.h"
#include "tests/server/server_process.h"
#include "tests/server/wire_blocks.h"

namespace kvtier {
namespace {

using Clock = std::chrono::steady_clock;

struct Prompt {
  std::vector<uint32_t> tokens;
  std::vector<testing::WireBlock> blocks;
};

struct Figures {
  std::atomic<uint64_t> ops{0}, puts{0}, gets_hit{0}, gets_miss{0}, deletes{0}, delete_failures{0}, reputs{0},
      prefetches{0}, lookups{0}, transport_errors{0}, wrong_bytes{0}, resurrected{0};
};

class ServerSoakTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* s = std::getenv("KVTIER_SOAK_SECONDS");
    seconds_ = s ? std::atoi(s) : 45;
    const auto layout = testing::tiny_layout(DType::kBF16);
    for (uint32_t p = 0; p < 24; ++p) {
      Prompt prompt;
      prompt.tokens = testing::prompt(1000 + p, 8 * 16);
      prompt.blocks = testing::prompt_blocks(layout, "m", prompt.tokens);
      prompts_.push_back(std::move(prompt));
    }
    state_ = std::vector<std::atomic<uint64_t>>(prompts_.size() * 8);
    disk_ = (dir_ / "disk").string();
    std::filesystem::create_directories(disk_);
    small_disk_ = ::mount("kvtier-soak", disk_.c_str(), "tmpfs", 0, "size=12582912") == 0;
  }
  void TearDown() override {
    if (small_disk_) ::umount2(disk_.c_str(), MNT_DETACH);
  }

  // Prompts [0, 16) are written over and over; the blocks of [16, 24) are deleted and written
  // again, one at a time, while everyone else runs. A block's state is a generation, bumped by each
  // answered DELETE and each PUT after one, and a bit: deleted (the DELETE was answered).
  static bool deleted(uint64_t state) { return state & 1; }
  static bool deletable(size_t prompt) { return prompt >= 16; }
  const testing::WireBlock& block(size_t id) const { return prompts_[id / 8].blocks[id % 8]; }

  std::unique_ptr<testing::ServerProcess> start(bool fill_disk) {
    std::vector<std::string> args{"--layout", "tiny", "--ssd-cache-dir", disk_ + "/ssd", "--ram-capacity", "1M",
                                  "--ssd-segment-size", "2M", "--ssd-capacity", fill_disk ? "64M" : "8M",
                                  "--log-level", "warn"};
    return std::make_unique<testing::ServerProcess>(
        (dir_ / ("kvtierd-" + std::to_string(++starts_) + ".log")).string(), args);
  }

  // A GET of block `id`; bytes other than those PUT, or a hit on a block whose DELETE was answered
  // before the GET was sent (and not PUT again since), are the faults this soak looks for.
  void check_get(KvtierClient& c, size_t id) {
    const uint64_t before = state_[id].load();
    auto got = c.get(block(id).hash, "m");
    const bool gone = deleted(before) && state_[id].load() == before;
    figures_.ops.fetch_add(1);
    if (!got.ok()) {
      (got.status().code() == StatusCode::kNotFound ? figures_.gets_miss : figures_.transport_errors).fetch_add(1);
      return;
    }
    figures_.gets_hit.fetch_add(1);
    if (*got != block(id).document) figures_.wrong_bytes.fetch_add(1);
    if (gone) {
      figures_.resurrected.fetch_add(1);
      ADD_FAILURE() << "block " << id << " served after its DELETE was answered";
    }
  }

  void run_round(int port, std::mt19937& rng, Clock::duration length) {
    std::atomic<bool> stop{false};
    std::vector<std::thread> threads;
    auto worker = [&](auto body) {
      threads.emplace_back([&, body, seed = rng()] {
        std::mt19937 r(seed);
        KvtierClient c("127.0.0.1", port);
        while (!stop.load()) body(c, r);
      });
    };
    for (int w = 0; w < 2; ++w) {
      worker([&](KvtierClient& c, std::mt19937& r) {  // writers
        const size_t id = r() % (16 * 8);
        auto put = c.put(block(id).hash, block(id).document, "m");
        figures_.ops.fetch_add(1);
        (put.ok() ? figures_.puts : figures_.transport_errors).fetch_add(1);
      });
    }
    for (int g = 0; g < 2; ++g) {
      worker([&](KvtierClient& c, std::mt19937& r) { check_get(c, r() % state_.size()); });  // readers
    }
    worker([&](KvtierClient& c, std::mt19937& r) {  // prefetchers, mostly of the prompts being deleted
      const size_t p = r() % 4 == 0 ? r() % 16 : 16 + r() % 8;
      auto got = c.prefetch("m", prompts_[p].tokens);
      figures_.ops.fetch_add(1);
      (got.ok() ? figures_.prefetches : figures_.transport_errors).fetch_add(1);
    });
    worker([&](KvtierClient& c, std::mt19937& r) {  // lookups: a deleted block must not be matched
      const size_t p = 16 + r() % 8;
      std::vector<uint64_t> before(8);
      for (size_t i = 0; i < 8; ++i) before[i] = state_[p * 8 + i].load();
      auto found = c.lookup("m", prompts_[p].tokens);
      std::vector<bool> gone(8);
      for (size_t i = 0; i < 8; ++i) gone[i] = deleted(before[i]) && state_[p * 8 + i].load() == before[i];
      figures_.ops.fetch_add(1);
      if (!found.ok()) {
        figures_.transport_errors.fetch_add(1);
        return;
      }
      figures_.lookups.fetch_add(1);
      const size_t matched = (*found)["blocks"].size();
      for (size_t i = 0; i < matched; ++i) {
        if (gone[i]) {
          figures_.resurrected.fetch_add(1);
          ADD_FAILURE() << "lookup matched block " << p * 8 + i << " after its DELETE was answered";
        }
      }
    });
    worker([&](KvtierClient& c, std::mt19937& r) {  // the deleter, who also writes deleted blocks again
      const size_t id = 16 * 8 + r() % (8 * 8);
      const uint64_t s = state_[id].load();
      figures_.ops.fetch_add(1);
      if (deleted(s)) {
        state_[id].store((s + 2) & ~uint64_t{1});  // live from the moment the PUT may land
        auto put = c.put(block(id).hash, block(id).document, "m");
        (put.ok() ? figures_.reputs : figures_.transport_errors).fetch_add(1);
      } else {
        const Status st = c.erase(block(id).hash, "m");
        if (st.ok() || st.code() == StatusCode::kNotFound) {
          state_[id].store((s + 2) | 1);  // answered: from here on it must not be served
          figures_.deletes.fetch_add(1);
        } else {
          figures_.delete_failures.fetch_add(1);  // a 5xx (a full disk), or the server died
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    });
    std::this_thread::sleep_for(length);
    stop = true;
    for (auto& t : threads) t.join();
  }

  testing::TempDir dir_;
  std::string disk_;
  bool small_disk_ = false;
  int seconds_ = 45;
  int starts_ = 0;
  std::vector<Prompt> prompts_;
  std::vector<std::atomic<uint64_t>> state_;
  Figures figures_;
};

TEST_F(ServerSoakTest, NoWrongByteAndNoDeletedBlockThroughKillsRestartsAndAFullDisk) {
  std::mt19937 rng(51);
  const auto end = Clock::now() + std::chrono::seconds(seconds_);
  int rounds = 0, kills = 0, full_disk_rounds = 0, failed_starts = 0;
  {
    auto first = start(false);
    ASSERT_GT(first->port(), 0) << first->log();
    KvtierClient c("127.0.0.1", first->port());
    for (size_t id = 16 * 8; id < state_.size(); ++id) ASSERT_TRUE(c.put(block(id).hash, block(id).document, "m").ok());
    ASSERT_EQ(first->stop(SIGTERM), 0) << first->log();  // on the SSD, as after any restart
  }
  while (Clock::now() < end && rounds < 60) {
    const bool fill = small_disk_ && rounds % 4 == 3;
    auto server = start(fill);
    if (server->port() == 0) {
      ++failed_starts;  // said why in its log; the next round tries again
      ADD_FAILURE() << "kvtierd did not start: " << server->log();
      break;
    }
    ++rounds;
    full_disk_rounds += fill ? 1 : 0;
    {
      KvtierClient c("127.0.0.1", server->port());
      for (size_t id = 16 * 8; id < state_.size(); ++id) {
        if (deleted(state_[id].load())) check_get(c, id);  // still gone after the restart
      }
    }
    run_round(server->port(), rng, std::chrono::milliseconds(800 + rng() % 1700));
    if (rng() % 4 == 0) {
      const int code = server->stop(SIGTERM);
      EXPECT_TRUE(code == 0 || code == 3) << "exit " << code << "\n" << server->log();
    } else {
      server->stop(SIGKILL);
      ++kills;
    }
  }
  // The last word: a clean start, every block read back.
  auto last = start(false);
  ASSERT_GT(last->port(), 0) << last->log();
  KvtierClient c("127.0.0.1", last->port());
  size_t kept_served = 0;
  size_t deleted_at_end = 0;
  for (size_t id = 0; id < state_.size(); ++id) {
    deleted_at_end += deleted(state_[id].load()) ? 1 : 0;
    const uint64_t hits = figures_.gets_hit.load();
    check_get(c, id);
    if (id < 16 * 8 && figures_.gets_hit.load() > hits) ++kept_served;
  }
  EXPECT_EQ(last->stop(SIGTERM), 0) << last->log();
  const Figures& f = figures_;
  std::printf("soak: %d rounds in %d s, %d kills, %d full-disk rounds%s, %d failed starts; %llu operations "
              "(%llu PUT, %llu GET hit, %llu GET miss, %llu DELETE answered, %llu DELETE failed, %llu PUT after a "
              "DELETE, %llu prefetch, %llu lookup, %llu refused by a dying server); wrong bytes %llu, deleted "
              "blocks served %llu; at the end %zu of 128 rewritten blocks served, %zu of 64 deletable blocks deleted\n",
              rounds, seconds_, kills, full_disk_rounds, small_disk_ ? "" : " (no tmpfs: the disk never filled)",
              failed_starts, (unsigned long long)f.ops.load(), (unsigned long long)f.puts.load(),
              (unsigned long long)f.gets_hit.load(), (unsigned long long)f.gets_miss.load(),
              (unsigned long long)f.deletes.load(), (unsigned long long)f.delete_failures.load(),
              (unsigned long long)f.reputs.load(), (unsigned long long)f.prefetches.load(), (unsigned long long)f.lookups.load(),
              (unsigned long long)f.transport_errors.load(), (unsigned long long)f.wrong_bytes.load(),
              (unsigned long long)f.resurrected.load(), kept_served, deleted_at_end);
  EXPECT_EQ(f.wrong_bytes.load(), 0u);
  EXPECT_EQ(f.resurrected.load(), 0u);
  EXPECT_GE(rounds, 4);
  EXPECT_GT(f.deletes.load(), 0u);
}

}  // namespace
}  // namespace kvtier
