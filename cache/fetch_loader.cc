#include "cache/fetch_loader.h"

#include <system_error>

#include <spdlog/spdlog.h>

#include "base/log.h"

namespace kvtier {

FetchLoader::FetchLoader(size_t threads) {
  for (size_t i = 0; i < threads; ++i) {
    try {
      threads_.emplace_back([this] { run(); });
    } catch (const std::system_error& e) {
      spdlog::error("fetch loader: started {} of {} threads: {}", threads_.size(), threads, e.what());
      break;
    }
  }
}

FetchLoader::~FetchLoader() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

bool FetchLoader::submit(std::function<void()> job) {
  if (threads_.empty()) return false;
  {
    std::lock_guard lock(mu_);
    jobs_.push_back(std::move(job));
  }
  cv_.notify_one();
  return true;
}

void FetchLoader::run() {
  name_this_thread("fetch-loader");
  while (true) {
    std::function<void()> job;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping, and every job done
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
  }
}

}  // namespace kvtier
