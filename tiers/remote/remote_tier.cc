#include "tiers/remote/remote_tier.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "base/memory/bytes.h"
#include "serialize/format/block_codec.h"

namespace kvtier {
namespace {

// How many recently written hashes a host remembers (~5 MB), to send a block once.
constexpr size_t kWrittenMemory = 65536;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

RemoteTier::RemoteTier(RemoteTierOptions options, std::shared_ptr<const LayoutRegistry> layouts,
                       std::unique_ptr<RedisCluster> cluster)
    : options_(std::move(options)), layouts_(std::move(layouts)), cluster_(std::move(cluster)) {}

Result<std::shared_ptr<RemoteTier>> RemoteTier::open(RemoteTierOptions options,
                                                     std::shared_ptr<const LayoutRegistry> layouts) {
  RedisClusterOptions co;
  co.address = options.address;
  co.timeouts = options.timeouts;
  // Values land in their own aligned buffers, which the decoder adopts as the blocks' storage.
  // Their checksums are computed by the decoder threads, not as the bytes arrive
  // (RespReaderOptions::checksum_after): on the reading thread the hash sat on the restore's
  // critical path (remote_bench on the H100 host, interleaved, 2 x 7 rounds: 2.81 / 3.30 GB/s
  // checksummed on arrival, 3.49 / 3.74 on the decoders).
  co.reconnect_backoff = options.reconnect_backoff;
  KVTIER_ASSIGN_OR_RETURN(auto cluster, RedisCluster::open(std::move(co)));
  if (!cluster->has_slot_map()) {
    spdlog::warn("remote tier: no node of {} answered; serving local tiers and retrying",
                 options.address.redacted());
  } else {
    spdlog::info("remote tier: {} ({})", options.address.redacted(),
                 cluster->standalone() ? "standalone" : "cluster");
  }
  std::shared_ptr<RemoteTier> t(new RemoteTier(std::move(options), std::move(layouts), std::move(cluster)));
  t->writer_ = std::thread([tier = t.get()] {
    name_this_thread("remote-writer");
    tier->writer_loop();
  });
  return t;
}

RemoteTier::~RemoteTier() { close(std::chrono::steady_clock::now() + std::chrono::seconds(10)); }

std::string RemoteTier::key_of(const BlockHash& hash) const { return options_.key_prefix + hash.hex(); }

Result<InsertOutcome> RemoteTier::insert(BlockRef block) {
  const uint64_t bytes = block->size_bytes();
  std::lock_guard lock(queue_mu_);
  if (written_.count(block->hash())) {
    metrics_.skipped_already_written.inc();
    return InsertOutcome::kAlreadyPresent;
  }
  if (stopping_) {
    metrics_.dropped_shutdown.inc();
    return failed_precondition("remote tier is closed");
  }
  if (refuse_erased(block->hash())) {
    return failed_precondition("remote tier: block " + block->hash().hex() + " was erased while it was being moved here");
  }
  if (queued_bytes_ + bytes > options_.write_queue_bytes && !displace_retries_locked(bytes)) {
    metrics_.dropped_queue_full.inc();
    if (auto n = write_log_.admit()) {
      spdlog::warn("remote tier: write queue full ({} bytes queued); block {} is not shared ({} similar suppressed)",
                   queued_bytes_, block->hash().hex(), *n);
    }
    return resource_exhausted("remote tier: write queue full");
  }
  queued_bytes_ += bytes;
  queue_.push_back(std::move(block));
  metrics_.queue_bytes.set(static_cast<int64_t>(queued_bytes_));
  metrics_.queue_blocks.set(static_cast<int64_t>(queue_.size()));
  queue_cv_.notify_one();
  return InsertOutcome::kInserted;
}

void RemoteTier::remember_written(const BlockHash& hash) {
  if (!written_.insert(hash).second) return;
  written_order_.push_back(hash);
  if (written_order_.size() > kWrittenMemory) {
    written_.erase(written_order_.front());
    written_order_.pop_front();
  }
}

void RemoteTier::set_held_locally(std::function<bool(const BlockHash&)> held) {
  std::lock_guard lock(queue_mu_);
  held_locally_ = std::move(held);
}

void RemoteTier::writer_loop() {
  using Clock = std::chrono::steady_clock;
  std::vector<BlockRef> batch, failed;
  std::vector<Retry> taken;
  while (true) {
    std::function<bool(const BlockHash&)> held;
    {
      std::unique_lock lock(queue_mu_);
      for (;;) {
        if (stopping_ && queue_.empty()) return;  // close() drops what is left and counts it
        if (!queue_.empty()) break;
        if (retries_.empty()) {
          queue_cv_.wait(lock);
          continue;
        }
        auto next = retries_.front().next_try;
        for (const Retry& r : retries_) next = std::min(next, r.next_try);
        if (next <= Clock::now()) break;
        queue_cv_.wait_until(lock, next);
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
      metrics_.queue_bytes.set(static_cast<int64_t>(queued_bytes_));
      metrics_.queue_blocks.set(static_cast<int64_t>(queue_.size()));
      metrics_.retry_blocks.set(static_cast<int64_t>(retries_.size()));
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
      std::lock_guard lock(queue_mu_);
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

void RemoteTier::take_due_retries_locked(std::vector<BlockRef>& batch, std::vector<Retry>& taken) {
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

void RemoteTier::schedule_retries_locked(std::vector<BlockRef>& failed, std::vector<Retry>& taken) {
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

bool RemoteTier::displace_retries_locked(uint64_t bytes) {
  while (queued_bytes_ + bytes > options_.write_queue_bytes && !retries_.empty()) {
    queued_bytes_ -= retries_.front().block->size_bytes();
    drop_retry(retries_.front(), metrics_.dropped_retry_displaced, "its room went to a fresh block");
    retries_.pop_front();
  }
  return queued_bytes_ + bytes <= options_.write_queue_bytes;
}

void RemoteTier::drop_retry(const Retry& r, Counter& reason, const char* why) {
  reason.inc();
  if (auto n = write_log_.admit()) {
    spdlog::warn("remote tier: gave up sharing block {} after its SET failed: {} ({} similar suppressed)",
                 r.block->hash().hex(), why, *n);
  }
}

void RemoteTier::write_batch(std::vector<BlockRef>& batch, std::vector<BlockRef>& failed) {
  const auto t0 = std::chrono::steady_clock::now();
  thread_local BlockCodec codec;
  std::vector<Bytes> frames;
  std::vector<std::string> keys;
  std::vector<BlockRef> encoded;
  for (BlockRef& b : batch) {
    Bytes frame;
    if (Status st = codec.encode(*b, frame); !st.ok()) {
      metrics_.dropped_encode_failed.inc();
      if (auto n = write_log_.admit()) {
        spdlog::error("remote tier: cannot encode block {}: {} ({} similar suppressed)", b->hash().hex(),
                      st.to_string(), *n);
      }
      continue;
    }
    frames.push_back(std::move(frame));
    keys.push_back(key_of(b->hash()));
    encoded.push_back(b);
  }
  std::vector<RedisCommand> cmds;
  for (size_t i = 0; i < frames.size(); ++i) {
    cmds.push_back({"SET", keys[i],
                    std::string_view(reinterpret_cast<const char*>(frames[i].data()), frames[i].size())});
  }
  std::vector<Result<RedisReply>> replies = cluster_->execute(cmds, options_.values_in_flight_per_node);
  metrics_.write_seconds.observe(seconds_since(t0));
  std::lock_guard lock(queue_mu_);
  for (size_t i = 0; i < replies.size(); ++i) {
    if (replies[i].ok() && replies[i]->is_status()) {
      metrics_.written_blocks.inc();
      metrics_.written_bytes.inc(frames[i].size());
      remember_written(encoded[i]->hash());
      continue;
    }
    metrics_.write_errors.inc();
    failed.push_back(encoded[i]);
    if (auto n = write_log_.admit()) {
      spdlog::warn("remote tier: SET of block {} failed (retried with backoff): {} ({} similar suppressed)",
                   encoded[i]->hash().hex(),
                   replies[i].ok() ? std::string(replies[i]->str()) : replies[i].status().to_string(), *n);
    }
  }
}

void RemoteTier::flush() {
  std::unique_lock lock(queue_mu_);
  idle_cv_.wait(lock, [&] { return (queue_.empty() && in_flight_ == 0) || !writer_.joinable(); });
}

void RemoteTier::close(std::chrono::steady_clock::time_point deadline) {
  {
    std::unique_lock lock(queue_mu_);
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
    queue_cv_.notify_all();
  }
  if (writer_.joinable()) writer_.join();
  idle_cv_.notify_all();
}

bool RemoteTier::contains(const BlockHash& hash) const { return contains_many(std::span(&hash, 1)).front(); }

std::vector<bool> RemoteTier::contains_many(std::span<const BlockHash> hashes) const {
  std::vector<bool> out(hashes.size(), false);
  if (hashes.empty()) return out;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> keys;
  for (const BlockHash& h : hashes) keys.push_back(key_of(h));
  std::vector<RedisCommand> cmds;
  for (const std::string& k : keys) cmds.push_back({"EXISTS", k});
  std::vector<Result<RedisReply>> replies = cluster_->execute(cmds);
  size_t errors = 0;
  for (size_t i = 0; i < replies.size(); ++i) {
    if (replies[i].ok() && replies[i]->is_integer()) out[i] = replies[i]->integer() > 0;
    else ++errors;
  }
  metrics_.exists_seconds.observe(seconds_since(t0));
  if (errors > 0) {
    metrics_.exists_errors.inc(errors);
    if (auto n = read_log_.admit()) {
      spdlog::warn("remote tier: {} of {} lookups could not ask Redis: {} ({} similar suppressed)", errors,
                   replies.size(), replies[0].ok() ? std::string(replies[0]->str()) : replies[0].status().to_string(), *n);
    }
  }
  return out;
}

Result<BlockRef> RemoteTier::read(const BlockRequest& request) {
  return std::move(read_many(std::span(&request, 1)).front());
}

Result<BlockRef> RemoteTier::accept(const BlockRequest& req, Result<RedisReply> r, bool* corrupt) {
  if (!r.ok() || r->is_error()) {
    metrics_.read_errors.inc();
    if (auto n = read_log_.admit()) {
      spdlog::warn("remote tier: GET of block {} failed (a miss): {} ({} similar suppressed)", req.hash.hex(),
                   r.ok() ? std::string(r->str()) : r.status().to_string(), *n);
    }
    return not_found("remote tier: unreachable");
  }
  if (r->is_nil()) {
    metrics_.misses.inc();
    return not_found("remote tier: not held");
  }
  const size_t length = r->str().size();
  metrics_.read_bytes.inc(length);
  thread_local BlockCodec codec;
  AlignedBuffer value = r->take_buffer();
  auto block = value.empty()
                   ? codec.decode({reinterpret_cast<const uint8_t*>(r->str().data()), length}, *layouts_)
                   : codec.decode_owned(std::move(value), length, *layouts_);
  std::string why;
  if (!block.ok()) why = block.status().message();
  else if (block->hash() != req.hash) why = "it holds block " + block->hash().hex();
  else if (!req.tokens_match(block->identity().token_ids)) why = "its token ids differ from the request's";
  if (!why.empty()) {
    metrics_.corrupt.inc();
    *corrupt = true;
    if (auto n = corrupt_log_.admit()) {
      spdlog::error("remote tier: value of block {} refused and deleted: {} ({} similar suppressed)",
                    req.hash.hex(), why, *n);
    }
    return not_found("remote tier: corrupt value");
  }
  metrics_.hits.inc();
  return BlockRef(std::make_shared<const Block>(std::move(block).value()));
}

std::vector<Result<BlockRef>> RemoteTier::read_many(std::span<const BlockRequest> requests) {
  std::vector<Result<BlockRef>> out;
  out.reserve(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) out.emplace_back(not_found("remote tier: not read"));
  if (requests.empty()) return out;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> keys;
  for (const BlockRequest& r : requests) keys.push_back(key_of(r.hash));
  std::vector<RedisCommand> cmds;
  for (const std::string& k : keys) cmds.push_back({"GET", k});
  std::vector<bool> corrupt(requests.size(), false);
  // Values are verified and decoded (and their replies freed) by a helper thread while this one
  // reads the next ones off the sockets, so checking costs no network time and a batch never
  // holds all its raw replies and all its blocks at once.
  std::mutex mu;  // guards arrived, reading_done
  std::condition_variable cv;
  std::deque<std::pair<size_t, Result<RedisReply>>> arrived;
  bool reading_done = false;
  auto decode = [&] {
    name_this_thread("remote-decode");
    while (true) {
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return !arrived.empty() || reading_done; });
      if (arrived.empty()) return;
      auto [i, r] = std::move(arrived.front());
      arrived.pop_front();
      lock.unlock();
      bool bad = false;
      Result<BlockRef> block = accept(requests[i], std::move(r), &bad);
      std::lock_guard done(mu);  // out and corrupt are shared by the decoders
      out[i] = std::move(block);
      corrupt[i] = bad;
    }
  };
  // Two decoders: verifying and copying a 2 MiB value takes about as long as reading it. Threads
  // of their own, not WorkerPool tasks: they wait on the reading for the whole fetch, and parked
  // on the pool they would hold workers other requests' parts need (a thread costs little beside
  // a fetch of 2 MiB values).
  std::thread decoders[] = {std::thread(decode), std::thread(decode)};
  cluster_->execute(cmds, options_.values_in_flight_per_node, [&](size_t i, Result<RedisReply> r) {
    std::lock_guard lock(mu);
    arrived.emplace_back(i, std::move(r));
    cv.notify_one();
  });
  {
    std::lock_guard lock(mu);
    reading_done = true;
    cv.notify_all();
  }
  for (std::thread& d : decoders) d.join();
  metrics_.read_seconds.observe(seconds_since(t0));
  std::vector<RedisCommand> dels;
  for (size_t i = 0; i < requests.size(); ++i) {
    if (corrupt[i]) dels.push_back({"DEL", keys[i]});
  }
  if (!dels.empty()) (void)cluster_->execute(dels);  // best effort: a value left behind is refused again
  return out;
}

bool RemoteTier::erase(const BlockHash& hash) {
  auto r = erase_durably(hash);
  return r.ok() && *r;
}

Result<bool> RemoteTier::erase_durably(const BlockHash& hash) {
  const std::string key = key_of(hash);
  {
    std::unique_lock lock(queue_mu_);
    if (written_.erase(hash)) std::erase(written_order_, hash);
    // Not written later: neither queued nor retried, and a batch writing it now ends before the DEL.
    for (auto it = queue_.begin(); it != queue_.end();) {
      if ((*it)->hash() != hash) {
        ++it;
        continue;
      }
      queued_bytes_ -= (*it)->size_bytes();
      it = queue_.erase(it);
    }
    for (auto it = retries_.begin(); it != retries_.end();) {
      if (it->block->hash() != hash) {
        ++it;
        continue;
      }
      queued_bytes_ -= it->block->size_bytes();
      it = retries_.erase(it);
    }
    metrics_.queue_bytes.set(static_cast<int64_t>(queued_bytes_));
    metrics_.queue_blocks.set(static_cast<int64_t>(queue_.size()));
    metrics_.retry_blocks.set(static_cast<int64_t>(retries_.size()));
    if (queue_.empty()) idle_cv_.notify_all();
    batch_cv_.wait(lock, [&] { return !writing_.count(hash); });
  }
  auto r = cluster_->execute(std::vector<RedisCommand>{{"DEL", key}});
  if (!r.front().ok()) return r.front().status().with_context("remote tier: DEL " + hash.hex());
  if (!r.front()->is_integer()) return io_error("remote tier: DEL " + hash.hex() + " got an unexpected reply");
  return r.front()->integer() > 0;
}

void RemoteTier::visit_metrics(MetricVisitor& v) const {
  const RemoteTierMetrics& m = metrics_;
  v.counter("kvtier_remote_reads_total", "Remote block reads by outcome", {{"outcome", "hit"}}, m.hits.value());
  v.counter("kvtier_remote_reads_total", "Remote block reads by outcome", {{"outcome", "miss"}}, m.misses.value());
  v.counter("kvtier_remote_reads_total", "Remote block reads by outcome", {{"outcome", "error"}},
            m.read_errors.value());
  v.counter("kvtier_remote_reads_total", "Remote block reads by outcome", {{"outcome", "corrupt"}},
            m.corrupt.value());
  v.counter("kvtier_remote_read_bytes_total", "Value bytes read from Redis", {}, m.read_bytes.value());
  v.counter("kvtier_remote_written_blocks_total", "Blocks written to Redis", {}, m.written_blocks.value());
  v.counter("kvtier_remote_written_bytes_total", "Value bytes written to Redis", {}, m.written_bytes.value());
  const char* drop = "Blocks not written to Redis, by reason";
  v.counter("kvtier_remote_write_failures_total", "SETs that failed (retried with backoff, or dropped below)", {},
            m.write_errors.value());
  v.counter("kvtier_remote_retried_written_total", "Blocks written on a retry after a failed SET", {},
            m.retried_written.value());
  v.counter("kvtier_remote_dropped_total", drop, {{"reason", "retries_expired"}}, m.dropped_retries_expired.value());
  v.counter("kvtier_remote_dropped_total", drop, {{"reason", "not_held_locally"}}, m.dropped_not_held_locally.value());
  v.counter("kvtier_remote_dropped_total", drop, {{"reason", "retry_displaced"}}, m.dropped_retry_displaced.value());
  v.counter("kvtier_remote_dropped_total", drop, {{"reason", "queue_full"}}, m.dropped_queue_full.value());
  v.counter("kvtier_remote_dropped_total", drop, {{"reason", "encode_failed"}}, m.dropped_encode_failed.value());
  v.counter("kvtier_remote_dropped_total", drop, {{"reason", "shutdown"}}, m.dropped_shutdown.value());
  v.counter("kvtier_remote_skipped_total", "Blocks not sent again: this host wrote them lately", {},
            m.skipped_already_written.value());
  v.counter("kvtier_remote_lookup_errors_total", "Remote lookups that could not ask Redis (read as misses)", {},
            m.exists_errors.value());
  v.gauge("kvtier_remote_queue_bytes", "Bytes waiting for the remote writer", {},
          static_cast<double>(m.queue_bytes.value()));
  v.gauge("kvtier_remote_queue_blocks", "Blocks waiting for the remote writer", {},
          static_cast<double>(m.queue_blocks.value()));
  v.gauge("kvtier_remote_retry_blocks", "Blocks whose SET failed, waiting for their next try", {},
          static_cast<double>(m.retry_blocks.value()));
  v.histogram("kvtier_remote_read_seconds", "One pipelined GET batch", {}, m.read_seconds.snapshot());
  v.histogram("kvtier_remote_write_seconds", "One pipelined SET batch", {}, m.write_seconds.snapshot());
  v.histogram("kvtier_remote_lookup_seconds", "One pipelined EXISTS batch", {}, m.exists_seconds.snapshot());
  v.counter("kvtier_remote_slot_refreshes_total", "Slot-map refreshes", {{"outcome", "ok"}},
            cluster_->refreshes() - cluster_->refresh_failures());
  v.counter("kvtier_remote_slot_refreshes_total", "Slot-map refreshes", {{"outcome", "failed"}},
            cluster_->refresh_failures());
  for (const RedisNodeStats& n : cluster_->node_stats()) {
    v.counter("kvtier_remote_node_commands_total", "Commands sent to each Redis node", {{"node", n.endpoint}},
              n.commands);
    v.counter("kvtier_remote_node_failures_total", "Commands that failed on each node's connection",
              {{"node", n.endpoint}}, n.failures);
    v.counter("kvtier_remote_node_bytes_total", "Reply bytes from each node", {{"node", n.endpoint}}, n.bytes_in);
  }
}

}  // namespace kvtier
