#include "tiers/remote/remote_write_behind.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "base/elapsed.h"
#include "base/memory/bytes.h"
#include "serialize/block_hash_format.h"
#include "serialize/format/block_codec.h"

namespace kvtier {
namespace {

// How many recently written hashes a host remembers (~5 MB), to send a block once.
constexpr size_t kWrittenMemory = 65536;

}  // namespace

RemoteWriteBehind::RemoteWriteBehind(const RemoteTierOptions& options, RedisCluster& cluster,
                                     RemoteTierMetrics& metrics)
    : options_(options), cluster_(cluster), metrics_(metrics) {}

RemoteWriteBehind::~RemoteWriteBehind() { close(std::chrono::steady_clock::now() + std::chrono::seconds(10)); }

void RemoteWriteBehind::start() {
  writer_ = std::thread([this] {
    name_this_thread("remote-writer");
    writer_loop();
  });
}

Result<InsertOutcome> RemoteWriteBehind::enqueue(BlockRef block,
                                                 const std::function<bool(const BlockHash&)>& refused) {
  const uint64_t bytes = block->size_bytes();
  std::lock_guard lock(mu_);
  if (written_.count(block->hash())) {
    metrics_.skipped_already_written.inc();
    return InsertOutcome::kAlreadyPresent;
  }
  if (stopping_) {
    metrics_.dropped_shutdown.inc();
    return failed_precondition("remote tier is closed");
  }
  if (refused(block->hash())) {
    return failed_precondition("remote tier: block " + block->hash().hex() + " was erased while it was being moved here");
  }
  if (queued_bytes_ + bytes > options_.write_queue_bytes && !displace_retries_locked(bytes)) {
    metrics_.dropped_queue_full.inc();
    log_.warn("remote tier: write queue full ({} bytes queued); block {} is not shared",
              queued_bytes_, block->hash());
    return resource_exhausted("remote tier: write queue full");
  }
  queued_bytes_ += bytes;
  queue_.push_back(std::move(block));
  publish_gauges_locked();
  work_cv_.notify_one();
  return InsertOutcome::kInserted;
}

bool RemoteWriteBehind::remember_written(const BlockHash& hash) {
  if (!written_.insert(hash).second) return false;
  written_order_.push_back(hash);
  if (written_order_.size() > kWrittenMemory) {
    written_.erase(written_order_.front());
    written_order_.pop_front();
  }
  return true;
}

void RemoteWriteBehind::set_events(std::shared_ptr<BlockEventSink> sink) {
  std::lock_guard lock(mu_);
  events_ = std::move(sink);
}

void RemoteWriteBehind::set_held_locally(std::function<bool(const BlockHash&)> held) {
  std::lock_guard lock(mu_);
  held_locally_ = std::move(held);
}

void RemoteWriteBehind::writer_loop() {
  using Clock = std::chrono::steady_clock;
  std::vector<BlockRef> batch, failed;
  std::vector<Retry> taken;
  while (true) {
    std::function<bool(const BlockHash&)> held;
    {
      std::unique_lock lock(mu_);
      for (;;) {
        if (stopping_ && queue_.empty()) return;  // close() drops what is left and counts it
        if (!queue_.empty()) break;
        if (retries_.empty()) {
          work_cv_.wait(lock);
          continue;
        }
        auto next = retries_.front().next_try;
        for (const Retry& r : retries_) next = std::min(next, r.next_try);
        if (next <= Clock::now()) break;
        work_cv_.wait_until(lock, next);
      }
      take_due_retries_locked(batch, taken);
      while (!queue_.empty() && batch.size() < options_.write_batch_blocks) {
        queued_bytes_ -= queue_.front()->size_bytes();
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      in_flight_ = batch.size();
      for (const BlockRef& b : batch) writing_.insert(b->hash());
      held = held_locally_;
      publish_gauges_locked();
    }
    // A retry is worth its SET only while this host still serves the block itself: once every
    // local tier let it go, it is dropped instead of kept alive here.
    if (held) {
      for (auto it = taken.begin(); it != taken.end();) {
        if (held(it->block->hash())) {
          ++it;
          continue;
        }
        drop_retry(*it, metrics_.dropped_not_held_locally, "no local tier holds it any more");
        std::erase(batch, it->block);
        it = taken.erase(it);
      }
    }
    if (!batch.empty()) write_batch(batch, failed);
    {
      std::lock_guard lock(mu_);
      in_flight_ = 0;
      writing_.clear();
      batch_cv_.notify_all();
      schedule_retries_locked(failed, taken);
      metrics_.retry_blocks.set(static_cast<int64_t>(retries_.size()));
      if (queue_.empty()) idle_cv_.notify_all();
    }
    batch.clear();
    failed.clear();
    taken.clear();
  }
}

void RemoteWriteBehind::take_due_retries_locked(std::vector<BlockRef>& batch, std::vector<Retry>& taken) {
  const auto now = std::chrono::steady_clock::now();
  for (auto it = retries_.begin(); it != retries_.end() && batch.size() < options_.write_batch_blocks;) {
    if (it->next_try > now) {
      ++it;
      continue;
    }
    queued_bytes_ -= it->block->size_bytes();
    if (now - it->first_failed >= options_.write_retry_window) {
      drop_retry(*it, metrics_.dropped_retries_expired, "still failing after the retry window");
    } else {
      batch.push_back(it->block);
      taken.push_back(std::move(*it));
    }
    it = retries_.erase(it);
  }
}

void RemoteWriteBehind::schedule_retries_locked(std::vector<BlockRef>& failed, std::vector<Retry>& taken) {
  const auto now = std::chrono::steady_clock::now();
  for (const Retry& r : taken) {
    if (std::find(failed.begin(), failed.end(), r.block) == failed.end()) metrics_.retried_written.inc();
  }
  for (BlockRef& b : failed) {
    auto before = std::find_if(taken.begin(), taken.end(), [&](const Retry& r) { return r.block == b; });
    Retry r = before == taken.end() ? Retry{b, now, now, options_.retry_backoff}
                                    : Retry{b, before->first_failed, now, std::min(before->backoff * 2, options_.retry_backoff_max)};
    r.next_try = now + r.backoff;
    const uint64_t bytes = b->size_bytes();
    if (stopping_) {
      drop_retry(r, metrics_.dropped_shutdown, "the tier is closing");
    } else if (queued_bytes_ + bytes > options_.write_queue_bytes && !displace_retries_locked(bytes)) {
      drop_retry(r, metrics_.dropped_retry_displaced, "the write queue is full of fresh blocks");
    } else {
      queued_bytes_ += bytes;
      retries_.push_back(std::move(r));
    }
  }
}

bool RemoteWriteBehind::displace_retries_locked(uint64_t bytes) {
  while (queued_bytes_ + bytes > options_.write_queue_bytes && !retries_.empty()) {
    queued_bytes_ -= retries_.front().block->size_bytes();
    drop_retry(retries_.front(), metrics_.dropped_retry_displaced, "its room went to a fresh block");
    retries_.pop_front();
  }
  return queued_bytes_ + bytes <= options_.write_queue_bytes;
}

void RemoteWriteBehind::drop_retry(const Retry& r, Counter& reason, const char* why) {
  reason.inc();
  log_.warn("remote tier: gave up sharing block {} after its SET failed: {}",
                  r.block->hash().hex(), why);
}

void RemoteWriteBehind::write_batch(std::vector<BlockRef>& batch, std::vector<BlockRef>& failed) {
  const auto t0 = std::chrono::steady_clock::now();
  thread_local BlockCodec codec;
  std::vector<Bytes> frames;
  std::vector<std::string> keys;
  std::vector<BlockRef> encoded;
  for (BlockRef& b : batch) {
    Bytes frame;
    if (Status st = codec.encode(*b, frame); !st.ok()) {
      metrics_.dropped_encode_failed.inc();
      log_.error("remote tier: cannot encode block {}: {}", b->hash().hex(), st.to_string());
      continue;
    }
    frames.push_back(std::move(frame));
    keys.push_back(remote_key(options_.key_prefix, b->hash()));
    encoded.push_back(b);
  }
  std::vector<RedisCommand> cmds;
  for (size_t i = 0; i < frames.size(); ++i) {
    cmds.push_back({"SET", keys[i],
                    std::string_view(reinterpret_cast<const char*>(frames[i].data()), frames[i].size())});
  }
  std::vector<Result<RedisReply>> replies = cluster_.execute(cmds, options_.values_in_flight_per_node);
  metrics_.write_seconds.observe(seconds_since(t0));
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < replies.size(); ++i) {
    if (replies[i].ok() && replies[i]->is_status()) {
      metrics_.written_blocks.inc();
      metrics_.written_bytes.inc(frames[i].size());
      if (remember_written(encoded[i]->hash()) && events_)
        events_->stored(stored_block(encoded[i]->identity()));
      continue;
    }
    metrics_.write_errors.inc();
    failed.push_back(encoded[i]);
    log_.warn(
        "remote tier: SET of block {} failed (retried with backoff): {}", encoded[i]->hash().hex(),
        replies[i].ok() ? std::string(replies[i]->str()) : replies[i].status().to_string());
  }
}

void RemoteWriteBehind::flush() {
  std::unique_lock lock(mu_);
  idle_cv_.wait(lock, [&] { return (queue_.empty() && in_flight_ == 0) || !writer_.joinable(); });
}

void RemoteWriteBehind::close(std::chrono::steady_clock::time_point deadline) {
  {
    std::unique_lock lock(mu_);
    if (stopping_ && !writer_.joinable()) return;
    idle_cv_.wait_until(lock, deadline, [&] { return queue_.empty() && in_flight_ == 0; });
    stopping_ = true;
    metrics_.dropped_shutdown.inc(queue_.size() + retries_.size());
    if (!queue_.empty() || !retries_.empty()) {
      spdlog::warn("remote tier: {} queued blocks and {} failed ones waiting for a retry not written at close",
                   queue_.size(), retries_.size());
    }
    queue_.clear();
    retries_.clear();
    queued_bytes_ = 0;
    work_cv_.notify_all();
  }
  if (writer_.joinable()) writer_.join();
  idle_cv_.notify_all();
}

void RemoteWriteBehind::forget(const BlockHash& hash) {
  std::unique_lock lock(mu_);
  if (written_.erase(hash)) std::erase(written_order_, hash);
  auto drop = [&](auto& list, auto block_of) {
    for (auto it = list.begin(); it != list.end();) {
      if (block_of(*it)->hash() != hash) {
        ++it;
        continue;
      }
      queued_bytes_ -= block_of(*it)->size_bytes();
      it = list.erase(it);
    }
  };
  drop(queue_, [](const BlockRef& b) { return b; });
  drop(retries_, [](const Retry& r) { return r.block; });
  publish_gauges_locked();
  if (queue_.empty()) idle_cv_.notify_all();
  batch_cv_.wait(lock, [&] { return !writing_.count(hash); });
}

void RemoteWriteBehind::publish_gauges_locked() {
  metrics_.queue_bytes.set(static_cast<int64_t>(queued_bytes_));
  metrics_.queue_blocks.set(static_cast<int64_t>(queue_.size()));
  metrics_.retry_blocks.set(static_cast<int64_t>(retries_.size()));
}

}  // namespace kvtier
