// KvEventQueue: where tiers leave their block events for the publisher thread. push() runs under
// the tiers' locks on the data path, so it never waits: past its capacity an event is dropped
// and counted (a router's view then misses it — keep kvtier_kv_events_dropped_total{reason=
// "queue_full"} at 0 by sizing --kv-events-queue). One BlockEventSink per medium feeds it.
#pragma once

#include <array>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "base/log.h"
#include "base/metrics/metrics.h"
#include "cache/events/kv_event.h"
#include "serialize/block_events.h"

namespace kvtier {

// Thread-safe.
class KvEventQueue : public std::enable_shared_from_this<KvEventQueue> {
 public:
  explicit KvEventQueue(size_t capacity) : capacity_(capacity) {}

  // Queued unless full or closed; counted either way. `wait_for_room`: waits while the queue is
  // full instead (for announcements made before the data path runs, never on it).
  void push(const KvEvent& event, std::span<const uint32_t> tokens = {}, std::string_view ns = {},
            bool wait_for_room = false);
  // Everything queued, oldest first, into `out` (cleared first); `through` is how many events were
  // ever accepted up to them. The queue keeps `out`'s old buffers: pass the same buffer each time,
  // so in a steady state no push allocates (pushes run under the tiers' locks).
  void take(KvEventBuffer& out, uint64_t& through);
  // Marks events up to `through` (from take) as handled: published or dropped downstream.
  void handled(uint64_t through);
  // Waits until every event accepted before the call is handled (or `timeout` passes).
  bool wait_handled(std::chrono::milliseconds timeout);
  // Refuses further events (tiers may outlive the publisher).
  void close();

  // A sink that queues the blocks of one medium (waiting for room: see push()).
  std::shared_ptr<BlockEventSink> sink(KvMedium medium, bool wait_for_room = false);

  uint64_t accepted(KvMedium m, KvEvent::Kind k) const {
    return accepted_by_[static_cast<size_t>(m)][static_cast<size_t>(k)].value();
  }
  uint64_t dropped_full() const { return dropped_full_.value(); }
  uint64_t dropped_closed() const { return dropped_closed_.value(); }
  size_t depth() const;

 private:
  const size_t capacity_;
  mutable std::mutex mu_;  // guards events_, accepted_, handled_, closed_
  std::condition_variable handled_cv_;
  std::condition_variable room_cv_;
  KvEventBuffer events_;
  uint64_t accepted_ = 0;
  uint64_t handled_ = 0;
  bool closed_ = false;
  std::array<std::array<Counter, 3>, kKvMediums> accepted_by_;
  Counter dropped_full_;
  Counter dropped_closed_;  // told after the publisher closed (a tier's last moves at shutdown)
  LogThrottle closed_log_;
};

}  // namespace kvtier
