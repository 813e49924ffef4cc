// RemoteTier: a cache shared by every kvtier host, on Redis Cluster — below a host's own tiers,
// never instead of them. Values are the framed block documents the SSD tier writes (checksummed,
// self-describing), under the key "<prefix><block hash hex>" (the hash already folds in the
// namespace and layout; a GET by hash does not know the namespace, so the key cannot carry it).
//
// Writes are write-behind: insert() only queues the block (bounded by bytes; what does not fit is
// dropped and counted) and the `remote-writer` thread encodes and SETs queued blocks in pipelined
// batches. A SET that fails (a node down, a failover) is retried with backoff while the block is
// still held by a local tier, so a prefix stored during an outage is shared once Redis is back;
// retries share the queue's byte bound and are dropped, counted, with a reason when they expire,
// when the block left the local tiers, or when fresh blocks need their room. Reads verify everything (frame checksums, document, hash, tokens, layout); a value that
// fails is deleted and counted, never served. Every failure of Redis — unreachable, a node down, a
// timeout — reads as a miss and is counted; capacity and eviction are Redis's own (maxmemory,
// allkeys-lru). Thread-safe.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_set>

#include "base/log.h"
#include "serialize/layout_registry.h"
#include "tiers/remote/redis_cluster.h"
#include "tiers/tier.h"

namespace kvtier {

struct RemoteTierOptions {
  RedisAddress address;
  std::string key_prefix = "kvtier:";
  uint64_t write_queue_bytes = 256ull << 20;  // blocks waiting for the writer
  size_t write_batch_blocks = 16;             // SETs per pipelined batch
  // Block values (GET, SET) in flight on one node at a time (every node works at once): Redis
  // copies pipelined values into its buffers, so deeper pipelines of 2 MiB values ran slower
  // (remote_bench: 1 in flight 2.13 GB/s, 4 in flight 1.56, 16 in flight 0.71 on the H100 host).
  size_t values_in_flight_per_node = 1;
  RedisTimeouts timeouts;
  std::chrono::milliseconds reconnect_backoff{1000};
  // A failed SET is tried again after retry_backoff, doubling up to retry_backoff_max, for at
  // most write_retry_window after its first failure.
  std::chrono::milliseconds retry_backoff{250};
  std::chrono::milliseconds retry_backoff_max{5000};
  std::chrono::milliseconds write_retry_window{120000};
};

struct RemoteTierMetrics {
  Counter hits;
  Counter misses;              // not there (including what Redis evicted)
  Counter read_errors;         // Redis unreachable or failing: read as misses
  Counter read_bytes;
  Counter corrupt;             // values that failed a check: deleted, never served
  Counter written_blocks;
  Counter written_bytes;
  Counter write_errors;        // SETs that failed (each is retried, or dropped with a reason below)
  Counter retried_written;     // written on a retry, after failing before
  Counter dropped_retries_expired;    // still failing after write_retry_window
  Counter dropped_not_held_locally;   // failed, and no local tier holds it any more
  Counter dropped_retry_displaced;    // a failed block's room went to a fresh one
  Counter dropped_queue_full;  // not queued: the writer is behind
  Counter dropped_encode_failed;
  Counter dropped_shutdown;    // still queued at close
  Counter skipped_already_written;
  Counter exists_errors;       // lookups that could not ask Redis: read as misses
  Gauge queue_bytes;
  Gauge queue_blocks;
  Gauge retry_blocks;          // failed SETs waiting for their next try
  Histogram read_seconds;      // one pipelined GET batch
  Histogram write_seconds;     // one pipelined SET batch
  Histogram exists_seconds;    // one pipelined EXISTS batch (a lookup's remote part)
};

class RemoteTier final : public Tier {
 public:
  // Fails only for settings that cannot work (bad credentials); Redis being unreachable is
  // logged and counted, and the tier serves misses until it comes back.
  static Result<std::shared_ptr<RemoteTier>> open(RemoteTierOptions options,
                                                  std::shared_ptr<const LayoutRegistry> layouts);
  ~RemoteTier() override;

  std::string_view name() const override { return "remote"; }
  bool remote() const override { return true; }
  // Queues `block` for the writer: kInserted when queued (or recently written by this host).
  Result<InsertOutcome> insert(BlockRef block) override;
  bool contains(const BlockHash& hash) const override;
  std::vector<bool> contains_many(std::span<const BlockHash> hashes) const override;
  Result<BlockRef> read(const BlockRequest& request) override;
  std::vector<Result<BlockRef>> read_many(std::span<const BlockRequest> requests) override;
  bool erase(const BlockHash& hash) override;
  // A DEL Redis did not answer is an error: the block may still be there for other hosts.
  Result<bool> erase_durably(const BlockHash& hash) override;
  // Nothing can be pinned in a shared store; the cache pins only its top tier.
  bool pin(const BlockHash&) override { return false; }
  void unpin(const BlockHash&) override {}
  uint64_t capacity_bytes() const override { return 0; }  // Redis's maxmemory, not ours
  uint64_t used_bytes() const override { return 0; }
  size_t block_count() const override { return 0; }
  void visit_metrics(MetricVisitor& visitor) const override;

  // Whether a local tier still holds a block (set by the cache stack): a failed write is retried
  // only while one does. Unset: always.
  void set_held_locally(std::function<bool(const BlockHash&)> held);
  // Waits until every block queued so far has been written (or failed: retries are not waited
  // for). For tests, benchmarks and shutdown.
  void flush();
  // Stops the writer after writing what is queued, bounded by `deadline`; the rest is dropped
  // and counted. Idempotent.
  void close(std::chrono::steady_clock::time_point deadline);

  const RemoteTierMetrics& metrics() const { return metrics_; }
  RedisCluster& cluster() { return *cluster_; }
  std::string key_of(const BlockHash& hash) const;

 private:
  RemoteTier(RemoteTierOptions options, std::shared_ptr<const LayoutRegistry> layouts,
             std::unique_ptr<RedisCluster> cluster);
  void writer_loop();
  struct Retry {
    BlockRef block;
    std::chrono::steady_clock::time_point first_failed;
    std::chrono::steady_clock::time_point next_try;
    std::chrono::milliseconds backoff;
  };
  // Writes `batch`; the blocks whose SET failed come back in `failed`.
  void write_batch(std::vector<BlockRef>& batch, std::vector<BlockRef>& failed);
  // Schedules the failed blocks of a batch (queue_mu_ held); `retries` are the ones that were.
  void schedule_retries_locked(std::vector<BlockRef>& failed, std::vector<Retry>& retries);
  // Due retries into `batch` (queue_mu_ held), dropping the expired ones.
  void take_due_retries_locked(std::vector<BlockRef>& batch, std::vector<Retry>& taken);
  // Makes room for `bytes` by dropping the oldest retries (queue_mu_ held); false if it cannot.
  bool displace_retries_locked(uint64_t bytes);
  void drop_retry(const Retry& r, Counter& reason, const char* why);
  void remember_written(const BlockHash& hash);
  // A GET's reply as a verified block, or a counted miss (`*corrupt` set for a value to delete).
  Result<BlockRef> accept(const BlockRequest& request, Result<RedisReply> reply, bool* corrupt);

  const RemoteTierOptions options_;
  std::shared_ptr<const LayoutRegistry> layouts_;
  std::unique_ptr<RedisCluster> cluster_;
  mutable RemoteTierMetrics metrics_;

  std::mutex queue_mu_;  // guards queue_, queued_bytes_, in_flight_, stopping_, written_*
  std::condition_variable queue_cv_;  // the writer waits for work
  std::condition_variable idle_cv_;   // flush() waits for an empty queue
  std::deque<BlockRef> queue_;
  std::deque<Retry> retries_;     // oldest first failure first
  uint64_t queued_bytes_ = 0;     // queue_ and retries_ together, bounded by write_queue_bytes
  size_t in_flight_ = 0;
  std::unordered_set<BlockHash> writing_;  // the batch being written now
  std::condition_variable batch_cv_;       // an erase waits for the batch writing its block
  bool stopping_ = false;
  // Hashes this host wrote lately, so a block published and later spilled is sent once.
  std::unordered_set<BlockHash> written_;
  std::deque<BlockHash> written_order_;
  std::thread writer_;
  std::function<bool(const BlockHash&)> held_locally_;  // set before blocks arrive

  mutable LogThrottle read_log_;
  mutable LogThrottle write_log_;
  mutable LogThrottle corrupt_log_;
};

}  // namespace kvtier
