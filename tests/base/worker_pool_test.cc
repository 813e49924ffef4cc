#include <atomic>
#include <chrono>
#include <latch>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "base/threads/worker_pool.h"

namespace kvtier {
namespace {

// Tasks run on the pool's threads, in parallel, and what they wrote is seen after join().
TEST(WorkerPoolTest, TasksRunOnItsThreadsInParallel) {
  WorkerPool pool(3);
  std::latch all_started(3);  // only three tasks running at once get past it
  std::vector<std::thread::id> ran_on(3);
  std::vector<WorkerPool::Task> tasks;
  for (int i = 0; i < 3; ++i) {
    tasks.push_back(pool.submit([&, i] {
      all_started.arrive_and_wait();
      ran_on[i] = std::this_thread::get_id();
    }));
  }
  // Joining the first would run it here if no worker had taken it yet: give the workers a moment
  // to take all three, so the latch proves they run at once.
  for (int spin = 0; spin < 200 && !all_started.try_wait(); ++spin) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (auto& t : tasks) t.join();
  const std::set<std::thread::id> threads(ran_on.begin(), ran_on.end());
  EXPECT_EQ(threads.size(), 3u);
  EXPECT_EQ(threads.count(std::this_thread::get_id()), 0u);
}

// A task that submits another and joins it finishes even when the pool has one thread (busy with
// the outer task): a task nobody started is run by its joiner.
TEST(WorkerPoolTest, ATaskJoiningATaskOnAFullPoolRunsItItself) {
  WorkerPool pool(1);
  std::atomic<int> inner_runs{0};
  std::thread::id outer_thread, inner_thread;
  auto outer = pool.submit([&] {
    outer_thread = std::this_thread::get_id();
    auto inner = pool.submit([&] {
      inner_thread = std::this_thread::get_id();
      ++inner_runs;
    });
    inner.join();
  });
  outer.join();
  EXPECT_EQ(inner_runs.load(), 1);
  if (outer_thread != std::this_thread::get_id()) {
    EXPECT_EQ(inner_thread, outer_thread);
  }
}

TEST(WorkerPoolTest, JoinRethrowsWhatTheTaskThrew) {
  WorkerPool pool(2);
  auto t = pool.submit([] { throw std::runtime_error("part failed"); });
  try {
    t.join();
    FAIL() << "join() returned";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "part failed");
  }
  EXPECT_FALSE(t.valid());
}

// A task that failed where nobody joins it (its owner unwinding) is not lost silently: the
// handle's destructor waits for it and logs the error once.
TEST(WorkerPoolTest, AnErrorNobodyCollectsIsLogged) {
  std::ostringstream log;
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(
      std::make_shared<spdlog::logger>("capture", std::make_shared<spdlog::sinks::ostream_sink_mt>(log)));
  {
    WorkerPool pool(1);
    auto t = pool.submit([] { throw std::runtime_error("disk gone"); });
  }  // never joined
  spdlog::set_default_logger(previous);
  EXPECT_NE(log.str().find("its owner never joined it: disk gone"), std::string::npos) << log.str();
}

// Many requests at once, each split into parts that nest (a striped read's directories, each
// split again): every part runs exactly once.
TEST(WorkerPoolTest, NestedPartsFromManyThreadsEachRunOnce) {
  WorkerPool pool(4);
  constexpr int kRequests = 8, kOuter = 4, kInner = 4;
  std::vector<std::atomic<int>> runs(kRequests * kOuter * kInner);
  std::vector<std::thread> requests;
  for (int r = 0; r < kRequests; ++r) {
    requests.emplace_back([&, r] {
      std::vector<WorkerPool::Task> outer;
      for (int o = 0; o < kOuter; ++o) {
        outer.push_back(pool.submit([&, r, o] {
          std::vector<WorkerPool::Task> inner;
          for (int i = 0; i < kInner; ++i) {
            inner.push_back(pool.submit([&, r, o, i] { ++runs[(r * kOuter + o) * kInner + i]; }));
          }
          for (auto& t : inner) t.join();
        }));
      }
      for (auto& t : outer) t.join();
    });
  }
  for (auto& t : requests) t.join();
  for (const auto& n : runs) EXPECT_EQ(n.load(), 1);
}

// A pool stopped with tasks still queued: their joiners run them.
TEST(WorkerPoolTest, TasksQueuedWhenThePoolStopsAreRunByTheirJoiners) {
  std::latch release(1);  // outlives the pool: a task it never started runs at its join, below
  std::vector<WorkerPool::Task> tasks;
  std::atomic<int> ran{0};
  {
    WorkerPool pool(1);
    tasks.push_back(pool.submit([&] { release.wait(); ++ran; }));
    for (int i = 0; i < 4; ++i) tasks.push_back(pool.submit([&] { ++ran; }));
    release.count_down();
  }
  for (auto& t : tasks) t.join();
  EXPECT_EQ(ran.load(), 5);
}

}  // namespace
}  // namespace kvtier
