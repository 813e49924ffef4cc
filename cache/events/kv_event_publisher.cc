#include "cache/events/kv_event_publisher.h"

#include <zmq.h>

#include <chrono>
#include <cstring>

#include <spdlog/spdlog.h>

namespace kvtier {
namespace {

// vLLM's end-of-replay marker: -1 as a signed 8-byte big-endian integer.
constexpr char kEndOfReplay[8] = {'\xff', '\xff', '\xff', '\xff', '\xff', '\xff', '\xff', '\xff'};

std::string zmq_failure(const std::string& what) { return what + ": " + zmq_strerror(zmq_errno()); }

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

Status set_option(void* socket, int option, int value, const char* name) {
  if (zmq_setsockopt(socket, option, &value, sizeof(value)) != 0) {
    return internal_error(zmq_failure(std::string("kv events: setting ") + name));
  }
  return ok_status();
}

// Binds `socket` to `endpoint`; returns the endpoint as bound (the port a "*" chose).
Result<std::string> bind(void* socket, const std::string& endpoint) {
  if (zmq_bind(socket, endpoint.c_str()) != 0) {
    return invalid_argument(zmq_failure("kv events: cannot bind " + endpoint));
  }
  char bound[256];
  size_t size = sizeof(bound);
  if (zmq_getsockopt(socket, ZMQ_LAST_ENDPOINT, bound, &size) != 0) return endpoint;
  return std::string(bound);
}

// One whole multipart message, or nothing when none is waiting.
std::vector<std::string> receive_message(void* socket) {
  std::vector<std::string> frames;
  int more = 1;
  while (more) {
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    if (zmq_msg_recv(&msg, socket, frames.empty() ? ZMQ_DONTWAIT : 0) < 0) {
      zmq_msg_close(&msg);
      return frames;
    }
    frames.emplace_back(static_cast<const char*>(zmq_msg_data(&msg)), zmq_msg_size(&msg));
    more = zmq_msg_more(&msg);
    zmq_msg_close(&msg);
  }
  return frames;
}

// Sends the frames as one message without waiting; false (errno set) when the socket refused
// the first frame (nothing sent then: ZMQ delivers a multipart message whole or not at all).
bool send_message(void* socket, std::initializer_list<std::string_view> frames) {
  size_t i = 0;
  for (std::string_view f : frames) {
    const int flags = ZMQ_DONTWAIT | (++i < frames.size() ? ZMQ_SNDMORE : 0);
    if (zmq_send(socket, f.data(), f.size(), flags) < 0) return false;
  }
  return true;
}

}  // namespace

KvEventPublisher::KvEventPublisher(KvEventsOptions options)
    : options_(std::move(options)), queue_(std::make_shared<KvEventQueue>(options_.queue_events)) {}

Result<std::unique_ptr<KvEventPublisher>> KvEventPublisher::open(KvEventsOptions options) {
  if (options.endpoint.empty()) return invalid_argument("kv events: no endpoint to publish on");
  if (options.max_batch_events == 0)
    return invalid_argument("kv events: a batch must hold at least one event");
  std::unique_ptr<KvEventPublisher> p(new KvEventPublisher(std::move(options)));
  const KvEventsOptions& o = p->options_;
  p->context_ = zmq_ctx_new();
  if (!p->context_) return internal_error(zmq_failure("kv events: zmq_ctx_new"));
  p->pub_ = zmq_socket(p->context_, ZMQ_XPUB);
  if (!p->pub_) return internal_error(zmq_failure("kv events: creating the publisher socket"));
  KVTIER_RETURN_IF_ERROR(set_option(p->pub_, ZMQ_SNDHWM, o.send_hwm, "ZMQ_SNDHWM"));
  KVTIER_RETURN_IF_ERROR(set_option(p->pub_, ZMQ_XPUB_NODROP, 1, "ZMQ_XPUB_NODROP"));
  KVTIER_RETURN_IF_ERROR(set_option(p->pub_, ZMQ_LINGER, 1000, "ZMQ_LINGER"));
  KVTIER_ASSIGN_OR_RETURN(p->endpoint_, bind(p->pub_, o.endpoint));
  if (!o.replay_endpoint.empty()) {
    p->replay_ = zmq_socket(p->context_, ZMQ_ROUTER);
    if (!p->replay_) return internal_error(zmq_failure("kv events: creating the replay socket"));
    // Room for a whole replay per client, with slack: the count of what a peer has read reaches
    // the sender only now and then. Mandatory routing makes a send that does not fit fail
    // (counted) instead of vanishing.
    KVTIER_RETURN_IF_ERROR(set_option(p->replay_, ZMQ_SNDHWM,
                                      static_cast<int>(2 * o.replay_batches + 1000), "ZMQ_SNDHWM"));
    KVTIER_RETURN_IF_ERROR(set_option(p->replay_, ZMQ_ROUTER_MANDATORY, 1, "ZMQ_ROUTER_MANDATORY"));
    KVTIER_RETURN_IF_ERROR(set_option(p->replay_, ZMQ_LINGER, 0, "ZMQ_LINGER"));
    KVTIER_ASSIGN_OR_RETURN(p->replay_endpoint_, bind(p->replay_, o.replay_endpoint));
  }
  p->thread_ = std::thread([raw = p.get()] { raw->run(); });
  spdlog::info("kv events: publishing on {} (topic '{}'){}", p->endpoint_, o.topic,
               p->replay_ ? ", replay on " + p->replay_endpoint_ : std::string());
  return p;
}

KvEventPublisher::~KvEventPublisher() { close(); }

void KvEventPublisher::all_blocks_cleared() {
  KvEvent e;
  e.kind = KvEvent::Kind::kAllCleared;
  queue_->push(e);
}

bool KvEventPublisher::flush(std::chrono::milliseconds timeout) {
  return queue_->wait_handled(timeout);
}

void KvEventPublisher::close() {
  // Closed first, so the thread's last pass takes every event accepted.
  queue_->close();
  if (thread_.joinable()) {
    stop_ = true;
    thread_.join();
  }
  if (replay_) zmq_close(replay_);
  if (pub_) zmq_close(pub_);  // lingers up to a second for batches still on their way
  if (context_) zmq_ctx_term(context_);
  replay_ = pub_ = context_ = nullptr;
}

void KvEventPublisher::run() {
  name_this_thread("kv-events");
  zmq_pollitem_t items[2] = {{pub_, 0, ZMQ_POLLIN, 0}, {replay_, 0, ZMQ_POLLIN, 0}};
  const int polled = replay_ ? 2 : 1;
  while (!stop_.load()) {
    // Wakes for subscriptions and replay requests; events wait at most one interval.
    const int ready = zmq_poll(items, polled, static_cast<long>(options_.batch_interval.count()));
    if (ready > 0) {
      if (items[0].revents & ZMQ_POLLIN) drain_subscriptions();
      if (polled == 2 && (items[1].revents & ZMQ_POLLIN)) serve_replay();
    } else if (ready < 0 && zmq_errno() != EINTR) {
      // Not a reason to stop publishing, nor to spin: events still go out once an interval.
      metrics_.poll_errors.inc();
      error_log_.error("kv events: polling the sockets: {}", zmq_strerror(zmq_errno()));
      std::this_thread::sleep_for(options_.batch_interval);
    }
    publish_queued();
  }
  while (publish_queued()) {
  }
}

bool KvEventPublisher::publish_queued() {
  uint64_t through = 0;
  KvEventBuffer& events = taken_;
  queue_->take(events, through);
  if (const uint64_t dropped = queue_->dropped_full(); dropped > queue_drops_logged_) {
    queue_full_log_.warn(
        "kv events: {} events dropped, the queue of {} was full (a router's view misses them)",
        dropped - queue_drops_logged_, options_.queue_events);
    queue_drops_logged_ = dropped;
  }
  for (size_t i = 0; i < events.size(); i += options_.max_batch_events) {
    send_batch(events, i, std::min(options_.max_batch_events, events.size() - i));
  }
  queue_->handled(through);
  return !events.empty();
}

void KvEventPublisher::send_batch(const KvEventBuffer& events, size_t first, size_t n) {
  std::string payload = encode_event_batch(unix_seconds(), events, first, n);
  const uint64_t seq = next_seq_++;
  const std::string seq_bytes = big_endian(seq);
  if (send_message(pub_, {options_.topic, seq_bytes, payload})) {
    metrics_.batches_sent.inc();
  } else if (zmq_errno() == EAGAIN) {
    metrics_.batches_held_back.inc();
    metrics_.events_held_back.inc(n);
    held_back_log_.warn(
        "kv events: batch {} ({} events) held back: a subscriber is {} batches behind; "
        "subscribers replay it from the ring",
        seq, n, options_.send_hwm);
  } else {
    metrics_.send_errors.inc();
    error_log_.error("kv events: sending batch {}: {} (left to the replay ring)", seq,
                     zmq_strerror(zmq_errno()));
  }
  ring_bytes_ += payload.size();
  ring_.emplace_back(seq, std::move(payload));
  while (!ring_.empty() &&
         (ring_.size() > options_.replay_batches || ring_bytes_ > options_.replay_bytes)) {
    ring_bytes_ -= ring_.front().second.size();
    ring_.pop_front();
  }
  metrics_.ring_batches.set(static_cast<int64_t>(ring_.size()));
  metrics_.ring_bytes.set(static_cast<int64_t>(ring_bytes_));
}

void KvEventPublisher::serve_replay() {
  for (std::vector<std::string> req = receive_message(replay_); !req.empty();
       req = receive_message(replay_)) {
    // [client identity, empty delimiter, start sequence]
    if (req.size() != 3 || !req[1].empty() || req[2].size() != 8) {
      metrics_.replay_malformed.inc();
      replay_log_.warn(
          "kv events: replay request of {} frames ignored: expected [identity, empty, "
          "8-byte big-endian start sequence]",
          req.size());
      continue;
    }
    metrics_.replay_requests.inc();
    const uint64_t start = from_big_endian(req[2]);
    if (!ring_.empty() && start < ring_.front().first) metrics_.replay_misses.inc();
    const std::string& client = req[0];
    bool whole = true;
    for (const auto& [seq, payload] : ring_) {
      if (seq < start) continue;
      whole = send_message(replay_, {client, "", big_endian(seq), payload});
      if (!whole) break;
      metrics_.replay_batches.inc();
    }
    // A client that does not read its replay (or left) gets no end marker: it asks again.
    if (whole) whole = send_message(replay_, {client, "", std::string_view(kEndOfReplay, 8), ""});
    if (!whole) {
      metrics_.replay_cut_short.inc();
      replay_log_.warn("kv events: a replay was cut short: {}", zmq_strerror(zmq_errno()));
    }
  }
}

void KvEventPublisher::drain_subscriptions() {
  // Subscriptions arrive as messages on an XPUB; nothing here depends on them.
  while (!receive_message(pub_).empty()) {
  }
}

void KvEventPublisher::visit_metrics(MetricVisitor& v) const {
  const char* events = "Block events published, by medium and type";
  for (size_t m = 0; m < kKvMediums; ++m) {
    const auto medium = static_cast<KvMedium>(m);
    const std::string name(medium_name(medium));
    v.counter("kvtier_kv_events_total", events, {{"medium", name}, {"type", "stored"}},
              queue_->accepted(medium, KvEvent::Kind::kStored));
    v.counter("kvtier_kv_events_total", events, {{"medium", name}, {"type", "removed"}},
              queue_->accepted(medium, KvEvent::Kind::kRemoved));
  }
  v.counter("kvtier_kv_events_total", events, {{"medium", "all"}, {"type", "all_blocks_cleared"}},
            queue_->accepted(KvMedium::kCpu, KvEvent::Kind::kAllCleared));
  const char* dropped =
      "Block events not sent, by reason (subscriber_behind: left in the replay ring)";
  v.counter("kvtier_kv_events_dropped_total", dropped, {{"reason", "queue_full"}},
            queue_->dropped_full());
  v.counter("kvtier_kv_events_dropped_total", dropped, {{"reason", "subscriber_behind"}},
            metrics_.events_held_back.value());
  v.counter("kvtier_kv_events_dropped_total", dropped, {{"reason", "closed"}},
            queue_->dropped_closed());
  const char* batches = "Event batches, by outcome";
  v.counter("kvtier_kv_event_batches_total", batches, {{"outcome", "sent"}},
            metrics_.batches_sent.value());
  v.counter("kvtier_kv_event_batches_total", batches, {{"outcome", "held_back"}},
            metrics_.batches_held_back.value());
  v.counter("kvtier_kv_event_batches_total", batches, {{"outcome", "error"}},
            metrics_.send_errors.value());
  v.counter("kvtier_kv_event_poll_errors_total", "Failed polls of the publisher's sockets (logged)",
            {}, metrics_.poll_errors.value());
  const char* replays = "Replay requests, by outcome";
  v.counter("kvtier_kv_event_replay_requests_total", replays, {{"outcome", "served"}},
            metrics_.replay_requests.value());
  v.counter("kvtier_kv_event_replay_requests_total", replays, {{"outcome", "malformed"}},
            metrics_.replay_malformed.value());
  v.counter("kvtier_kv_event_replay_requests_total", replays, {{"outcome", "older_than_ring"}},
            metrics_.replay_misses.value());
  v.counter("kvtier_kv_event_replay_requests_total", replays, {{"outcome", "cut_short"}},
            metrics_.replay_cut_short.value());
  v.counter("kvtier_kv_event_replay_batches_total", "Batches sent again to replay clients", {},
            metrics_.replay_batches.value());
  v.gauge("kvtier_kv_events_queued", "Events waiting for the publisher thread", {},
          static_cast<double>(queue_->depth()));
  v.gauge("kvtier_kv_event_ring_batches", "Batches the replay ring holds", {},
          static_cast<double>(metrics_.ring_batches.value()));
  v.gauge("kvtier_kv_event_ring_bytes", "Payload bytes the replay ring holds", {},
          static_cast<double>(metrics_.ring_bytes.value()));
}

}  // namespace kvtier
