// FetchLoader: the threads that run TieredCache::fetch_async's loads, so an engine's thread keeps
// decoding while a prefix comes off the SSD or the network. Jobs start in submission order on the
// first free thread; the destructor finishes every job already submitted, then joins.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvtier {

// Thread-safe.
class FetchLoader {
 public:
  explicit FetchLoader(size_t threads);
  ~FetchLoader();
  FetchLoader(const FetchLoader&) = delete;
  FetchLoader& operator=(const FetchLoader&) = delete;

  // False when no thread could be started (the caller then runs the job itself).
  bool submit(std::function<void()> job);

 private:
  void run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace kvtier
