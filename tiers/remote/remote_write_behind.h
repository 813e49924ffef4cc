// RemoteWriteBehind: the remote tier's writes. enqueue() only queues a block (bounded by bytes;
// what does not fit is dropped and counted) and the `remote-writer` thread encodes and SETs queued
// blocks in pipelined batches. A SET that fails (a node down, a failover) is retried with backoff
// while a local tier still holds the block, so a prefix stored during an outage is shared once
// Redis is back; retries share the queue's byte bound and are dropped, counted, with a reason, when
// they expire, when the block left the local tiers, or when fresh blocks need their room. A block
// this host wrote lately is not sent again. Thread-safe.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <unordered_set>
#include <vector>

#include "base/log.h"
#include "tiers/remote/remote_tier_options.h"
#include "tiers/tier.h"

namespace kvtier {

class RemoteWriteBehind {
 public:
  // `cluster` and `metrics` outlive this.
  RemoteWriteBehind(const RemoteTierOptions& options, RedisCluster& cluster, RemoteTierMetrics& metrics);
  ~RemoteWriteBehind();  // close(now + 10 s)
  RemoteWriteBehind(const RemoteWriteBehind&) = delete;
  RemoteWriteBehind& operator=(const RemoteWriteBehind&) = delete;

  // Starts the writer thread.
  void start();
  // Queues `block`: kInserted when queued, kAlreadyPresent when this host wrote it lately.
  // `refused` is asked under the queue's lock, so an erase that forget()s the block is ordered
  // against it (the erase fence's check).
  Result<InsertOutcome> enqueue(BlockRef block, const std::function<bool(const BlockHash&)>& refused);
  // `hash` is not written later: it leaves the queue and the retries, and a batch writing it now
  // ends before this returns (an erase's DEL then comes after its SET).
  void forget(const BlockHash& hash);
  // Whether a local tier still holds a block: a failed write is retried only while one does.
  // Unset: always.
  void set_held_locally(std::function<bool(const BlockHash&)> held);
  // Told of each block this host writes to the store (KV events, medium REMOTE).
  void set_events(std::shared_ptr<BlockEventSink> sink);
  // Waits until every block queued so far has been written (or failed: retries are not waited
  // for).
  void flush();
  // Stops the writer after writing what is queued, bounded by `deadline`; the rest is dropped
  // and counted. Idempotent.
  void close(std::chrono::steady_clock::time_point deadline);

 private:
  struct Retry {
    BlockRef block;
    std::chrono::steady_clock::time_point first_failed;
    std::chrono::steady_clock::time_point next_try;
    std::chrono::milliseconds backoff;
  };
  void writer_loop();
  // Writes `batch`; the blocks whose SET failed come back in `failed`.
  void write_batch(std::vector<BlockRef>& batch, std::vector<BlockRef>& failed);
  // Schedules the failed blocks of a batch (mu_ held); `taken` are the retries the batch carried.
  void schedule_retries_locked(std::vector<BlockRef>& failed, std::vector<Retry>& taken);
  // Due retries into `batch` (mu_ held), dropping the expired ones.
  void take_due_retries_locked(std::vector<BlockRef>& batch, std::vector<Retry>& taken);
  // Makes room for `bytes` by dropping the oldest retries (mu_ held); false if it cannot.
  bool displace_retries_locked(uint64_t bytes);
  void drop_retry(const Retry& r, Counter& reason, const char* why);
  // False when it was remembered already.
  bool remember_written(const BlockHash& hash);
  void publish_gauges_locked();

  const RemoteTierOptions& options_;
  RedisCluster& cluster_;
  RemoteTierMetrics& metrics_;

  std::mutex mu_;  // guards everything below but writer_
  std::condition_variable work_cv_;   // the writer waits for work
  std::condition_variable idle_cv_;   // flush() waits for an empty queue
  std::condition_variable batch_cv_;  // forget() waits for the batch writing its block
  std::deque<BlockRef> queue_;
  std::deque<Retry> retries_;  // oldest first failure first
  uint64_t queued_bytes_ = 0;  // queue_ and retries_ together, bounded by write_queue_bytes
  size_t in_flight_ = 0;
  std::unordered_set<BlockHash> writing_;  // the batch being written now
  bool stopping_ = false;
  // Hashes this host wrote lately, so a block published and later spilled is sent once.
  std::unordered_set<BlockHash> written_;
  std::deque<BlockHash> written_order_;
  std::shared_ptr<BlockEventSink> events_;
  std::function<bool(const BlockHash&)> held_locally_;  // set before blocks arrive
  std::thread writer_;
  LogThrottle log_;
};

}  // namespace kvtier
