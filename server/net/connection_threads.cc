#include "server/net/connection_threads.h"

#include <pthread.h>

#include <memory>

#include "base/log.h"

namespace kvtier {
namespace {

// A connection's thread parses requests and runs handlers (JSON, block encoding): a few hundred
// KiB of stack at most. 1 MiB keeps a thousand parked connections at a gigabyte of address
// space, not the default 8 GiB.
constexpr size_t kStackBytes = 1 << 20;

struct Start {
  ConnectionThreads* self;
  std::function<void()> fn;
};

}  // namespace

ConnectionThreads::ConnectionThreads(size_t max_threads, ConnectionMetrics& metrics)
    : max_threads_(std::max<size_t>(1, max_threads)), metrics_(metrics) {}

ConnectionThreads::~ConnectionThreads() { shutdown(); }

void ConnectionThreads::enqueue(std::function<void()> fn) {
  metrics_.accepted.inc();
  std::unique_lock lock(mu_);
  if (running_ >= max_threads_) return wait_locked(std::move(fn));
  ++running_;
  metrics_.open.add(1);
  lock.unlock();
  if (!start_thread(fn)) {
    // No thread to be had (the OS limit): serve it when a running one is free, or here if none is.
    metrics_.thread_failures.inc();
    lock.lock();
    if (running_ > 1) {
      --running_;
      metrics_.open.add(-1);
      return wait_locked(std::move(fn));
    }
    lock.unlock();
    run(std::move(fn));
  }
}

void ConnectionThreads::wait_locked(std::function<void()> fn) {
  waiting_.push_back(std::move(fn));
  metrics_.waited.inc();
  metrics_.waiting.set(static_cast<int64_t>(waiting_.size()));
}

bool ConnectionThreads::start_thread(std::function<void()>& fn) {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, kStackBytes);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  auto start = std::make_unique<Start>(Start{this, std::move(fn)});
  pthread_t tid;
  const int err = pthread_create(
      &tid, &attr,
      [](void* p) -> void* {
        std::unique_ptr<Start> s(static_cast<Start*>(p));
        name_this_thread("kvtierd-conn");
        s->self->run(std::move(s->fn));
        return nullptr;
      },
      start.get());
  pthread_attr_destroy(&attr);
  if (err != 0) {
    fn = std::move(start->fn);
    static LogThrottle log;
    log.error("cannot start a connection thread (errno {})", err);
    return false;
  }
  start.release();  // the thread owns it
  return true;
}

void ConnectionThreads::run(std::function<void()> fn) {
  for (;;) {
    fn();
    std::lock_guard lock(mu_);
    if (waiting_.empty()) {
      metrics_.open.add(-1);
      if (--running_ == 0) idle_.notify_all();
      return;
    }
    fn = std::move(waiting_.front());
    waiting_.pop_front();
    metrics_.waiting.set(static_cast<int64_t>(waiting_.size()));
  }
}

void ConnectionThreads::shutdown() {
  std::unique_lock lock(mu_);
  idle_.wait(lock, [&] { return running_ == 0 && waiting_.empty(); });
}


}  // namespace kvtier
