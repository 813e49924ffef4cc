#include "tiers/remote/remote_tier.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "base/elapsed.h"
#include "base/memory/bytes.h"
#include "serialize/format/block_codec.h"

namespace kvtier {
RemoteTier::RemoteTier(RemoteTierOptions options, std::shared_ptr<const LayoutRegistry> layouts,
                       std::unique_ptr<RedisCluster> cluster)
    : options_(std::move(options)),
      layouts_(std::move(layouts)),
      cluster_(std::move(cluster)),
      writes_(options_, *cluster_, metrics_) {}

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
  t->writes_.start();
  return t;
}

RemoteTier::~RemoteTier() { close(std::chrono::steady_clock::now() + std::chrono::seconds(10)); }

std::string RemoteTier::key_of(const BlockHash& hash) const { return remote_key(options_.key_prefix, hash); }

Result<InsertOutcome> RemoteTier::insert(BlockRef block) {
  return writes_.enqueue(std::move(block), [this](const BlockHash& h) { return refuse_erased(h); });
}

void RemoteTier::set_held_locally(std::function<bool(const BlockHash&)> held) {
  writes_.set_held_locally(std::move(held));
}

void RemoteTier::flush() { writes_.flush(); }

void RemoteTier::close(std::chrono::steady_clock::time_point deadline) { writes_.close(deadline); }

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
    read_log_.warn(
        "remote tier: {} of {} lookups could not ask Redis: {}", errors, replies.size(),
        replies[0].ok() ? std::string(replies[0]->str()) : replies[0].status().to_string());
  }
  return out;
}

Result<BlockRef> RemoteTier::read(const BlockRequest& request) {
  return std::move(read_many(std::span(&request, 1)).front());
}

Result<BlockRef> RemoteTier::accept(const BlockRequest& req, Result<RedisReply> r, bool* corrupt) {
  if (!r.ok() || r->is_error()) {
    metrics_.read_errors.inc();
    read_log_.warn("remote tier: GET of block {} failed (a miss): {}", req.hash.hex(),
                   r.ok() ? std::string(r->str()) : r.status().to_string());
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
    corrupt_log_.error("remote tier: value of block {} refused and deleted: {}", req.hash.hex(),
                       why);
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
  writes_.forget(hash);
  auto r = cluster_->execute(std::vector<RedisCommand>{{"DEL", key_of(hash)}});
  if (!r.front().ok()) return r.front().status().with_context("remote tier: DEL " + hash.hex());
  if (!r.front()->is_integer()) return io_error("remote tier: DEL " + hash.hex() + " got an unexpected reply");
  const bool held = r.front()->integer() > 0;
  if (held) announce_removed(hash);
  return held;
}

void RemoteTier::set_block_events(std::shared_ptr<BlockEventSink> sink) {
  writes_.set_events(sink);
  Tier::set_block_events(std::move(sink));
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
