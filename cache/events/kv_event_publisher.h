// KvEventPublisher: kvtier's block events for prefix-aware routers, over ZeroMQ in vLLM's format
// (cache/events/kv_event.h), so a router that follows vLLM engines — llm-d's KV-cache indexer,
// NVIDIA Dynamo's KV router — can follow kvtier's tiers with the same subscriber.
//
// Wire, as vLLM's ZmqEventPublisher: each batch is a three-frame message [topic, sequence
// (8 bytes, big-endian, from 0), payload (an msgpack EventBatch)] on a PUB-compatible socket; a
// subscriber that sees a gap in the sequence asks the replay socket (ROUTER) with [empty, start
// sequence (8 bytes, big-endian)] and gets [empty, sequence, payload] for every batch from there
// still in the ring, then [empty, -1 (8 bytes), empty]. Both sockets are bound (a server's
// endpoints: "tcp://127.0.0.1:5557", "tcp://*:5557"; a port of "*" picks a free one).
//
// Never blocks the data path: tiers queue events (KvEventQueue, bounded); a thread batches them
// every batch_interval, numbers each batch, keeps it in the replay ring and sends it without
// waiting. A subscriber that does not read fills its pipe (send_hwm batches); from then on
// batches are held back from every subscriber rather than lost unseen to one (ZMQ_XPUB_NODROP):
// each is counted as dropped and stays in the ring, so every subscriber sees the gap and can
// replay it.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <thread>

#include "base/log.h"
#include "base/metrics/metrics.h"
#include "base/status.h"
#include "cache/events/kv_event_queue.h"

namespace kvtier {

struct KvEventsOptions {
  std::string endpoint;         // where subscribers connect; required
  std::string replay_endpoint;  // the replay socket; empty: none
  std::string topic = "kv-events";
  size_t queue_events = 100000;  // events waiting for the publisher thread
  size_t max_batch_events = 1024;
  std::chrono::milliseconds batch_interval{5};
  size_t replay_batches = 10000;        // the ring keeps at most this many batches...
  uint64_t replay_bytes = 64ull << 20;  // ...and this many payload bytes
  int send_hwm = 1000;                  // batches queued per subscriber
};

struct KvEventPublisherMetrics {
  Counter batches_sent;
  Counter batches_held_back;  // a subscriber's pipe full: not sent to anyone, left to replay
  Counter events_held_back;
  Counter send_errors;
  Counter poll_errors;
  Counter replay_requests;
  Counter replay_malformed;
  Counter replay_batches;
  Counter replay_cut_short;  // the client did not read (or left) before its replay was sent
  Counter replay_misses;     // asked from a sequence the ring no longer holds
  Gauge ring_batches;
  Gauge ring_bytes;
};

// Thread-safe.
class KvEventPublisher {
 public:
  // Binds the sockets (an error names the endpoint) and starts the publisher thread.
  static Result<std::unique_ptr<KvEventPublisher>> open(KvEventsOptions options);
  ~KvEventPublisher();
  KvEventPublisher(const KvEventPublisher&) = delete;
  KvEventPublisher& operator=(const KvEventPublisher&) = delete;

  // What a tier of `medium` tells of its blocks.
  std::shared_ptr<BlockEventSink> sink(KvMedium medium) { return queue_->sink(medium); }
  // A sink for announcing what a tier holds at start: it waits for room rather than dropping.
  std::shared_ptr<BlockEventSink> announcing_sink(KvMedium medium) {
    return queue_->sink(medium, true);
  }
  // AllBlocksCleared: whatever a subscriber held for this publisher is gone (a start).
  void all_blocks_cleared();
  // The endpoints as bound (with the port a "*" picked).
  const std::string& endpoint() const { return endpoint_; }
  const std::string& replay_endpoint() const { return replay_endpoint_; }
  // Waits until every event queued before the call is sent or held back. For tests and close.
  bool flush(std::chrono::milliseconds timeout = std::chrono::seconds(5));
  // Publishes what is queued, then stops and closes the sockets. Later events are counted as
  // dropped (reason "closed"). Idempotent.
  void close();

  const KvEventPublisherMetrics& metrics() const { return metrics_; }
  const KvEventQueue& queue() const { return *queue_; }
  void visit_metrics(MetricVisitor& visitor) const;

 private:
  explicit KvEventPublisher(KvEventsOptions options);
  void run();
  // Sends the queued events as batches; false when there were none.
  bool publish_queued();
  void send_batch(const KvEventBuffer& events, size_t first, size_t n);
  void serve_replay();
  void drain_subscriptions();

  KvEventsOptions options_;
  std::shared_ptr<KvEventQueue> queue_;
  void* context_ = nullptr;
  void* pub_ = nullptr;
  void* replay_ = nullptr;
  std::string endpoint_;
  std::string replay_endpoint_;
  // Publisher thread only.
  uint64_t next_seq_ = 0;
  KvEventBuffer taken_;  // the last events taken from the queue (its buffers go back)
  std::deque<std::pair<uint64_t, std::string>> ring_;
  uint64_t ring_bytes_ = 0;
  uint64_t queue_drops_logged_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  KvEventPublisherMetrics metrics_;
  LogThrottle held_back_log_;
  LogThrottle error_log_;
  LogThrottle queue_full_log_;
  LogThrottle replay_log_;
};

}  // namespace kvtier
