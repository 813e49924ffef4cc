#include "base/threads/worker_pool.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>

namespace kvtier {

struct WorkerPool::Job {
  std::function<void()> fn;
  std::atomic<bool> claimed{false};  // whoever sets it runs fn: a worker or the joining thread
  std::mutex mu;                     // guards done and error
  std::condition_variable finished;
  bool done = false;
  std::exception_ptr error;
};

void WorkerPool::run_job(Job& job) {
  std::exception_ptr error;
  try {
    job.fn();
  } catch (...) {
    error = std::current_exception();
  }
  job.fn = nullptr;  // what it captured goes now, not when the last handle does
  std::lock_guard lock(job.mu);
  job.error = error;
  job.done = true;
  job.finished.notify_all();
}

WorkerPool::Task::~Task() {
  if (!job_) return;
  // A task whose owner never joined (it is unwinding, say): its error has nobody else to go to.
  try {
    join();
  } catch (const std::exception& e) {
    spdlog::error("worker pool: a task failed and its owner never joined it: {}", e.what());
  } catch (...) {
    spdlog::error("worker pool: a task failed (not a std::exception) and its owner never joined it");
  }
}

void WorkerPool::Task::join() {
  if (!job_) return;
  std::shared_ptr<Job> job = std::move(job_);
  if (!job->claimed.exchange(true)) {
    run_job(*job);
  } else {
    std::unique_lock lock(job->mu);
    job->finished.wait(lock, [&] { return job->done; });
  }
  if (job->error) std::rethrow_exception(job->error);
}

WorkerPool::WorkerPool(size_t threads) {
  workers_.reserve(threads);
  for (size_t i = 0; i < threads; ++i) workers_.emplace_back([this] { work(); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  ready_.notify_all();
  for (std::thread& t : workers_) t.join();
}

WorkerPool& WorkerPool::shared() {
  static WorkerPool* pool =
      new WorkerPool(std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 8));  // never destroyed
  return *pool;
}

WorkerPool::Task WorkerPool::submit(std::function<void()> fn) {
  auto job = std::make_shared<Job>();
  job->fn = std::move(fn);
  {
    std::lock_guard lock(mu_);
    queue_.push_back(job);
  }
  ready_.notify_one();
  return Task(std::move(job));
}

void WorkerPool::work() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock lock(mu_);
      ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      // Stopping drains nothing: a queued task's joiner runs it itself.
      if (stopping_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    if (!job->claimed.exchange(true)) run_job(*job);
  }
}

}  // namespace kvtier
