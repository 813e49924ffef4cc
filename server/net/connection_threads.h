// ConnectionThreads: one thread per open connection, started when the connection arrives and
// ended when it closes. A connection is served on one thread from accept to close, so a fixed
// pool of N threads is stalled by N idle clients (64 of them once made /healthz wait 5 s each);
// here an idle connection costs one parked thread (a small stack) and never delays another. Past
// `max_threads` connections wait for a thread (counted).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>

#include "base/metrics/metrics.h"

namespace kvtier {

// Owned by the listener (the threads live only while it accepts).
struct ConnectionMetrics {
  Counter accepted;
  Counter waited;      // found every thread busy and waited for one
  Counter thread_failures;  // the OS refused a thread; served by a running one instead
  Gauge open;          // connections being served
  Gauge waiting;
};

class ConnectionThreads {
 public:
  ConnectionThreads(size_t max_threads, ConnectionMetrics& metrics);
  ~ConnectionThreads();

  void enqueue(std::function<void()> fn);
  // Returns when every connection has been served.
  void shutdown();

 private:
  void run(std::function<void()> fn);  // on its own thread: fn, then queued work, then exit
  bool start_thread(std::function<void()>& fn);
  void wait_locked(std::function<void()> fn);

  const size_t max_threads_;
  ConnectionMetrics& metrics_;
  std::mutex mu_;
  std::condition_variable idle_;
  std::deque<std::function<void()>> waiting_;
  size_t running_ = 0;
};

}  // namespace kvtier
