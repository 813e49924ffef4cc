// WorkerPool: a few long-lived threads that run the parts of one request in parallel (the SSD
// reader's parts, a striped read's directories, a prefix's slices). Starting a thread per part
// cost more than the part on the H200 host: each thread's exit returns its stack with madvise, a
// TLB shootdown across all 16 vCPUs, 5 % of a small-block restore's CPU (perf). For work that
// runs to its end on its own, not for tasks that wait on their submitter: those would park
// workers that other requests' parts need.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace kvtier {

class WorkerPool {
  struct Job;

 public:
  // A task handed to the pool. join() returns once it ran; a task no worker has started yet is
  // run by the joining thread itself, so a task may submit and join others (a worker waiting on
  // a task never waits for a queue that only it could drain). join() rethrows what the task threw.
  class Task {
   public:
    Task() = default;
    Task(Task&&) noexcept = default;
    Task& operator=(Task&&) noexcept = default;
    ~Task();  // joins
    void join();
    bool valid() const { return job_ != nullptr; }

   private:
    friend class WorkerPool;
    explicit Task(std::shared_ptr<Job> job) : job_(std::move(job)) {}
    std::shared_ptr<Job> job_;
  };

  explicit WorkerPool(size_t threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // The process's pool: min(8, hardware threads) workers, started on first use, never stopped
  // (requests may still be running while static objects are destroyed at exit).
  static WorkerPool& shared();

  Task submit(std::function<void()> fn);
  size_t threads() const { return workers_.size(); }

 private:
  void work();
  static void run_job(Job& job);

  std::mutex mu_;  // guards queue_ and stopping_
  std::condition_variable ready_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace kvtier
