// RemoteTier: a cache shared by every kvtier host, on Redis Cluster — below a host's own tiers,
// never instead of them. Values are the framed block documents the SSD tier writes (checksummed,
// self-describing), under the key "<prefix><block hash hex>" (the hash already folds in the
// namespace and layout; a GET by hash does not know the namespace, so the key cannot carry it).
//
// Writes are write-behind (RemoteWriteBehind: insert() only queues the block, a writer thread
// SETs it, failures are retried while a local tier holds the block). Reads verify everything
// (frame checksums, document, hash, tokens, layout); a value that fails is deleted and counted,
// never served. Every failure of Redis — unreachable, a node down, a
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
#include "tiers/remote/remote_tier_options.h"
#include "tiers/remote/remote_write_behind.h"
#include "tiers/tier.h"

namespace kvtier {

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
  // The store is shared and evicts on its own: the events say what this host wrote and deleted.
  void set_block_events(std::shared_ptr<BlockEventSink> sink) override;
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
  // A GET's reply as a verified block, or a counted miss (`*corrupt` set for a value to delete).
  Result<BlockRef> accept(const BlockRequest& request, Result<RedisReply> reply, bool* corrupt);

  const RemoteTierOptions options_;
  std::shared_ptr<const LayoutRegistry> layouts_;
  std::unique_ptr<RedisCluster> cluster_;
  mutable RemoteTierMetrics metrics_;

  RemoteWriteBehind writes_;  // after the cluster and the metrics it uses

  mutable LogThrottle read_log_;
  mutable LogThrottle corrupt_log_;
};

}  // namespace kvtier
