#include "tests/tiers/ssd/ssd_crash_driver.h"

#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <random>
#include <thread>

#include "tests/tiers/ssd/ssd_test_env.h"
#include "tiers/ssd/ssd_tier.h"

extern char** environ;

namespace kvtier::testing {

std::shared_ptr<const KvLayout> crash_layout() {
  static auto l = share(KvLayout::uniform("crash", 2, 2, 64, 16, DType::kBF16));
  return l;
}

SsdTierOptions crash_tier_options(const std::string& dir) {
  SsdTierOptions o = small_ssd_options(dir);
  o.capacity_bytes = 24 << 20;
  o.drain_timeout = std::chrono::milliseconds(0);
  return o;
}

Result<CrashTotals> run_crash_cycles(const CrashOptions& options) {
  CrashTotals totals;
  std::mt19937_64 rng(options.seed);
  auto layouts = std::make_shared<LayoutRegistry>();
  KVTIER_RETURN_IF_ERROR(layouts->add(*crash_layout()).status());
  for (int cycle = 0; cycle < options.cycles; ++cycle) {
    // Seeds of each cycle's blocks start at a fresh range, so every hash is new.
    const std::string first_seed = std::to_string((cycle + 1) * 10'000'000ull);
    const char* argv[] = {options.child.c_str(), options.dir.c_str(), first_seed.c_str(), nullptr};
    int ready[2];
    if (::pipe(ready) != 0) return errno_status("pipe", errno);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, ready[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&fa, ready[0]);
    pid_t pid = 0;
    const int rc = posix_spawn(&pid, options.child.c_str(), &fa, nullptr,
                               const_cast<char* const*>(argv), environ);
    posix_spawn_file_actions_destroy(&fa);
    ::close(ready[1]);
    if (rc != 0) {
      ::close(ready[0]);
      return errno_status("spawn " + options.child, rc);
    }
    // The kill window starts once the child has opened the tier (its start-up, slow under
    // sanitizers, is not what is being tested).
    pollfd pfd{ready[0], POLLIN, 0};
    char first = 0;
    const bool started = ::poll(&pfd, 1, 60'000) == 1 && ::read(ready[0], &first, 1) == 1;
    ::close(ready[0]);
    if (!started) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
      return internal_error("crash child did not start spilling within 60 s");
    }
    const int run_ms = options.min_run_ms +
                       static_cast<int>(rng() % (options.max_run_ms - options.min_run_ms + 1));
    std::this_thread::sleep_for(std::chrono::milliseconds(run_ms));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFSIGNALED(status)) {
      return internal_error("crash child exited on its own (status " + std::to_string(status) +
                            ") instead of being killed");
    }

    auto tier = SsdTier::open(crash_tier_options(options.dir), layouts);
    if (!tier.ok()) return tier.status().with_context("reopen after kill " + std::to_string(cycle));
    std::vector<BlockHash> hashes;
    KVTIER_RETURN_IF_ERROR((*tier)->state_for_testing().index->scan_entries(
        [&](const BlockHash& h, const Result<IndexEntry>&) { hashes.push_back(h); }));
    totals.entries += hashes.size();
    for (const BlockHash& h : hashes) {
      auto got = (*tier)->read({h, {}});
      if (!got.ok()) {
        ++totals.quarantined;
        continue;
      }
      const uint64_t seed = (*got)->identity().token_ids.front() / crash_layout()->block_size;
      BlockRef expected = seeded_block(crash_layout(), seed);
      if (!same_bytes(**got, *expected) || !((*got)->identity() == expected->identity())) {
        ++totals.wrong;
      } else {
        ++totals.intact;
      }
    }
    totals.recovery_dropped += (*tier)->metrics().recovery_dropped_entries.value();
    (*tier)->close();
    ++totals.cycles;
  }
  return totals;
}

}  // namespace kvtier::testing
