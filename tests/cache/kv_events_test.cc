// KV events: each tier tells of every block entering and leaving it, in order, so that replaying
// the events gives exactly the set it holds; the publisher sends them in vLLM's wire format, holds
// batches back (counted, replayable) from a subscriber that stopped reading, and replays them.
#include <zmq.h>

#include <atomic>
#include <cstring>
#include <map>
#include <set>
#include <thread>

#define MSGPACK_NO_BOOST
#include <msgpack.hpp>

#include <gtest/gtest.h>

#include "cache/events/kv_event_publisher.h"
#include "tests/cache/ram_over_ssd.h"

namespace kvtier::testing {
namespace {

// An event taken out of its buffer, with its own copies of the token ids and namespace.
struct OwnedEvent : KvEvent {
  std::vector<uint32_t> token_ids;
  std::string namespace_id;
};

// What a router would hold after the events, per medium.
std::map<KvMedium, std::set<BlockHash>> replay(const std::vector<OwnedEvent>& events) {
  std::map<KvMedium, std::set<BlockHash>> held;
  for (const OwnedEvent& e : events) {
    if (e.kind == KvEvent::Kind::kStored) held[e.medium].insert(e.hash);
    if (e.kind == KvEvent::Kind::kRemoved) held[e.medium].erase(e.hash);
    if (e.kind == KvEvent::Kind::kAllCleared) held.clear();
  }
  return held;
}

std::vector<OwnedEvent> take_all(KvEventQueue& q) {
  uint64_t through = 0;
  KvEventBuffer taken;
  q.take(taken, through);
  std::vector<OwnedEvent> out;
  for (size_t i = 0; i < taken.size(); ++i) {
    OwnedEvent e{taken[i], {}, {}};
    const auto tokens = taken.tokens(taken[i]);
    e.token_ids.assign(tokens.begin(), tokens.end());
    e.namespace_id = taken.namespace_of(taken[i]);
    out.push_back(std::move(e));
  }
  return out;
}

TEST(KvEventsTest, ReplayingATiersEventsGivesExactlyTheBlocksItHolds) {
  TempDir dir;
  RamOverSsd stack(dir.path(), 6 * ssd_sized_layout()->dense_block_bytes());
  auto queue = std::make_shared<KvEventQueue>(100000);
  stack.ram->set_block_events(queue->sink(KvMedium::kCpu));
  stack.ssd->set_block_events(queue->sink(KvMedium::kSsd));
  const PrefixHasher h = ssd_sized_hasher();
  std::vector<BlockHash> all;
  for (uint32_t p = 0; p < 5; ++p) {
    // keys() keeps views of the tokens: they must outlive the keys.
    const std::vector<uint32_t> tokens = prompt(64, p + 1);
    const auto keys = h.keys(tokens, {});
    for (size_t i = 0; i < keys.size(); ++i) {
      ASSERT_TRUE(stack.cache->insert(ssd_sized_block(h, keys, i)).ok());
      all.push_back(keys[i].hash);
    }
  }
  stack.ssd->flush();
  ASSERT_TRUE(stack.cache->erase(all[0]).ok());      // on the SSD by now
  ASSERT_TRUE(stack.cache->erase(all.back()).ok());  // still in RAM
  stack.ssd->flush();

  auto held = replay(take_all(*queue));
  std::set<BlockHash> in_ram, on_ssd;
  for (const BlockRef& b : stack.ram->blocks()) in_ram.insert(b->hash());
  for (const BlockHash& x : all) {
    if (stack.ssd->contains(x)) on_ssd.insert(x);
  }
  EXPECT_FALSE(in_ram.empty());
  EXPECT_FALSE(on_ssd.empty());
  EXPECT_EQ(in_ram.size() + on_ssd.size(), all.size() - 2)
      << "RAM let every block go to the SSD, but the two erased";
  EXPECT_EQ(held[KvMedium::kCpu], in_ram);
  EXPECT_EQ(held[KvMedium::kSsd], on_ssd);
  EXPECT_EQ(queue->accepted(KvMedium::kCpu, KvEvent::Kind::kStored), all.size());
  EXPECT_EQ(queue->dropped_full(), 0u);
}

TEST(KvEventsTest, AStoredEventCarriesTheBlocksIdentity) {
  TempDir dir;
  RamOverSsd stack(dir.path(), 64 * ssd_sized_layout()->dense_block_bytes());
  auto queue = std::make_shared<KvEventQueue>(100);
  stack.ram->set_block_events(queue->sink(KvMedium::kCpu));
  const PrefixHasher h = ssd_sized_hasher();
  const std::vector<uint32_t> tokens = prompt(32, 7);  // keys() keeps views of them
  const auto keys = h.keys(tokens, {});
  const BlockRef second = ssd_sized_block(h, keys, 1);
  ASSERT_TRUE(stack.cache->insert(second).ok());
  const auto events = take_all(*queue);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].hash, keys[1].hash);
  ASSERT_TRUE(events[0].has_parent);
  EXPECT_EQ(events[0].parent, keys[0].hash);
  EXPECT_EQ(events[0].token_ids, second->identity().token_ids);
  EXPECT_EQ(events[0].block_tokens, 16u);
  EXPECT_EQ(events[0].namespace_id, second->identity().namespace_id);
}

TEST(KvEventsTest, TheSsdAnnouncesWhatItKeptAcrossARestart) {
  TempDir dir;
  const PrefixHasher h = ssd_sized_hasher();
  const std::vector<uint32_t> tokens = prompt(80, 3);  // keys() keeps views of them
  const auto keys = h.keys(tokens, {});
  {
    RamOverSsd stack(dir.path(), 64 * ssd_sized_layout()->dense_block_bytes());
    for (size_t i = 0; i < keys.size(); ++i)
      ASSERT_TRUE(stack.ssd->insert(ssd_sized_block(h, keys, i)).ok());
    stack.ssd->flush();
    stack.ssd->close();
  }
  RamOverSsd reopened(dir.path(), 64 * ssd_sized_layout()->dense_block_bytes());
  auto queue =
      std::make_shared<KvEventQueue>(2);  // smaller than the announcement: it waits for room
  // The announcement waits for room; this thread takes what it queued until it is done.
  std::atomic<bool> done{false};
  Status announced_status;
  std::thread announcer([&] {
    announced_status =
        reopened.ssd->announce_held(*queue->sink(KvMedium::kSsd, /*wait_for_room=*/true));
    done = true;
  });
  std::vector<OwnedEvent> seen;
  for (bool last = false; !last;) {
    last = done.load();
    for (OwnedEvent& e : take_all(*queue)) seen.push_back(std::move(e));
    std::this_thread::yield();
  }
  announcer.join();
  ASSERT_TRUE(announced_status.ok()) << announced_status.to_string();
  std::set<BlockHash> announced;
  for (const OwnedEvent& e : seen) {
    EXPECT_EQ(e.kind, KvEvent::Kind::kStored);
    EXPECT_TRUE(e.token_ids.empty()) << "an index knows no tokens";
    EXPECT_EQ(e.block_tokens, 16u);
    announced.insert(e.hash);
  }
  std::set<BlockHash> written;
  for (const BlockKey& k : keys) written.insert(k.hash);
  EXPECT_EQ(announced, written);
  EXPECT_EQ(queue->dropped_full(), 0u);
}

TEST(KvEventsTest, ABufferKeepsEachEventsTokensAndNamespaceThroughReuse) {
  // More namespaces than the buffer looks back over, interleaved, and a second fill after clear()
  // that reuses the slots the first left behind.
  KvEventBuffer b;
  for (int fill = 0; fill < 2; ++fill) {
    b.clear();
    for (uint32_t i = 0; i < 40; ++i) {
      KvEvent e;
      e.hash.bytes[0] = static_cast<uint8_t>(i);
      const std::vector<uint32_t> tokens(i % 5, 1000 * fill + i);
      b.append(e, tokens, i % 3 == 0 ? "" : "tenant-" + std::to_string((i * 7 + fill) % 12));
    }
    ASSERT_EQ(b.size(), 40u);
    for (uint32_t i = 0; i < 40; ++i) {
      EXPECT_EQ(b[i].hash.bytes[0], i);
      const auto tokens = b.tokens(b[i]);
      EXPECT_EQ(std::vector<uint32_t>(tokens.begin(), tokens.end()),
                std::vector<uint32_t>(i % 5, 1000 * fill + i));
      EXPECT_EQ(b.namespace_of(b[i]),
                i % 3 == 0 ? "" : "tenant-" + std::to_string((i * 7 + fill) % 12));
    }
  }
}

// A batch's timestamp is a msgpack float 64 whatever its value: vLLM's EventBatch.ts is a float,
// and msgpack-cxx's own packer writes a whole number of seconds as an integer (a batch stamped on a
// whole second once went out as one).
TEST(KvEventsTest, ABatchTimestampIsAFloatEvenOnAWholeSecond) {
  const KvEventBuffer none;
  for (double ts : {1795922653.0, 0.0, 1795922653.25, -2.0, 1e300}) {
    const std::string payload = encode_event_batch(ts, none, 0, 0);
    msgpack::object_handle oh = msgpack::unpack(payload.data(), payload.size());
    const msgpack::object& batch = oh.get();
    ASSERT_EQ(batch.type, msgpack::type::ARRAY);
    ASSERT_EQ(batch.via.array.size, 2u);
    ASSERT_EQ(batch.via.array.ptr[0].type, msgpack::type::FLOAT64) << ts;
    EXPECT_EQ(std::memcmp(&batch.via.array.ptr[0].via.f64, &ts, sizeof ts), 0) << ts;
    EXPECT_EQ(batch.via.array.ptr[1].via.array.size, 0u);
  }
}

TEST(KvEventsTest, AFullQueueDropsAndCountsInsteadOfWaiting) {
  KvEventQueue q(3);
  for (int i = 0; i < 5; ++i) q.push(KvEvent{});
  EXPECT_EQ(q.depth(), 3u);
  EXPECT_EQ(q.dropped_full(), 2u);
  q.close();
  q.push(KvEvent{});
  EXPECT_EQ(q.dropped_closed(), 1u);
}

// --- The publisher, with real ZeroMQ sockets
// --------------------------------------------------------

struct ZmqContext {
  void* ctx = zmq_ctx_new();
  ~ZmqContext() { zmq_ctx_term(ctx); }
};

struct Socket {
  Socket(void* ctx, int type) : s(zmq_socket(ctx, type)) {
    int linger = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger));
  }
  ~Socket() { zmq_close(s); }
  void* s;
};

// One message's frames; empty after `timeout_ms` with none.
std::vector<std::string> receive(void* s, int timeout_ms) {
  zmq_pollitem_t item{s, 0, ZMQ_POLLIN, 0};
  if (zmq_poll(&item, 1, timeout_ms) <= 0) return {};
  std::vector<std::string> frames;
  int more = 1;
  while (more) {
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, s, 0) < 0) break;
    frames.emplace_back(static_cast<const char*>(zmq_msg_data(&m)), zmq_msg_size(&m));
    more = zmq_msg_more(&m);
    zmq_msg_close(&m);
  }
  return frames;
}

uint64_t sequence(const std::string& frame) {
  uint64_t v = 0;
  for (char c : frame) v = (v << 8) | static_cast<uint8_t>(c);
  return v;
}

OwnedEvent stored_event(uint8_t n, KvMedium medium) {
  OwnedEvent e;
  e.medium = medium;
  e.hash.bytes[0] = n;
  e.has_parent = n > 0;
  e.parent.bytes[0] = static_cast<uint8_t>(n - 1);
  e.block_tokens = 4;
  e.token_ids = {n, 2u * n, 3u * n, 4u * n};
  e.namespace_id = "tenant-a/model";
  return e;
}

// The options of a publisher at `endpoint`, everything else at its default.
KvEventsOptions options_at(std::string endpoint) {
  KvEventsOptions o;
  o.endpoint = std::move(endpoint);
  return o;
}

std::unique_ptr<KvEventPublisher> open_publisher(KvEventsOptions o) {
  auto p = KvEventPublisher::open(std::move(o));
  EXPECT_TRUE(p.ok()) << p.status().to_string();
  return p.ok() ? std::move(p).value() : nullptr;
}

// A subscriber connected and subscribed: ZeroMQ drops what is published before the subscription
// reaches the publisher, so the publisher says AllBlocksCleared until one arrives.
void await_subscription(KvEventPublisher& pub, void* sub) {
  for (int i = 0; i < 500; ++i) {
    pub.all_blocks_cleared();
    ASSERT_TRUE(pub.flush());
    if (!receive(sub, 10).empty()) return;
  }
  FAIL() << "the subscription never arrived";
}

void drain(void* sub) {
  while (!receive(sub, 50).empty()) {
  }
}

TEST(KvEventPublisherTest, BatchesAreVllmEventBatchesNumberedInOrder) {
  auto pub = open_publisher(options_at("tcp://127.0.0.1:*"));
  ASSERT_TRUE(pub);
  ZmqContext z;
  Socket sub(z.ctx, ZMQ_SUB);
  ASSERT_EQ(zmq_connect(sub.s, pub->endpoint().c_str()), 0);
  ASSERT_EQ(zmq_setsockopt(sub.s, ZMQ_SUBSCRIBE, "kv-events", 9), 0);
  await_subscription(*pub, sub.s);
  drain(sub.s);

  auto sink = pub->sink(KvMedium::kSsd);
  const OwnedEvent e = stored_event(5, KvMedium::kSsd);
  sink->stored(StoredBlock{e.hash, &e.parent, e.token_ids, e.block_tokens, e.namespace_id});
  sink->removed(e.hash);
  ASSERT_TRUE(pub->flush());
  const auto frames = receive(sub.s, 2000);
  ASSERT_EQ(frames.size(), 3u);
  EXPECT_EQ(frames[0], "kv-events");
  ASSERT_EQ(frames[1].size(), 8u);

  msgpack::object_handle oh = msgpack::unpack(frames[2].data(), frames[2].size());
  const msgpack::object& batch = oh.get();
  ASSERT_EQ(batch.type, msgpack::type::ARRAY);
  ASSERT_EQ(batch.via.array.size, 2u) << "[ts, events]: data_parallel_rank left out at its default";
  EXPECT_EQ(batch.via.array.ptr[0].type, msgpack::type::FLOAT64);
  const msgpack::object& events = batch.via.array.ptr[1];
  ASSERT_EQ(events.via.array.size, 2u);
  const msgpack::object* stored = events.via.array.ptr[0].via.array.ptr;
  ASSERT_EQ(events.via.array.ptr[0].via.array.size, 8u);
  EXPECT_EQ(stored[0].as<std::string>(), "BlockStored");
  ASSERT_EQ(stored[1].via.array.size, 1u);
  const msgpack::object& hash = stored[1].via.array.ptr[0];
  ASSERT_EQ(hash.type, msgpack::type::BIN);
  EXPECT_EQ(std::string(hash.via.bin.ptr, hash.via.bin.size),
            std::string(reinterpret_cast<const char*>(e.hash.bytes.data()), 32));
  EXPECT_EQ(std::string(stored[2].via.bin.ptr, stored[2].via.bin.size),
            std::string(reinterpret_cast<const char*>(e.parent.bytes.data()), 32));
  EXPECT_EQ(stored[3].as<std::vector<uint32_t>>(), e.token_ids);
  EXPECT_EQ(stored[4].as<uint32_t>(), 4u);
  EXPECT_TRUE(stored[5].is_nil()) << "lora_id";
  EXPECT_EQ(stored[6].as<std::string>(), "SSD");
  EXPECT_EQ(stored[7].as<std::string>(), "tenant-a/model") << "the namespace, as lora_name";
  const msgpack::object& removed = events.via.array.ptr[1];
  ASSERT_EQ(removed.via.array.size, 3u);
  EXPECT_EQ(removed.via.array.ptr[0].as<std::string>(), "BlockRemoved");
  EXPECT_EQ(removed.via.array.ptr[2].as<std::string>(), "SSD");

  pub->all_blocks_cleared();
  ASSERT_TRUE(pub->flush());
  const auto next = receive(sub.s, 2000);
  ASSERT_EQ(next.size(), 3u);
  EXPECT_EQ(sequence(next[1]), sequence(frames[1]) + 1);
  msgpack::object_handle cleared = msgpack::unpack(next[2].data(), next[2].size());
  EXPECT_EQ(cleared.get().via.array.ptr[1].via.array.ptr[0].via.array.ptr[0].as<std::string>(),
            "AllBlocksCleared");
}

// [empty, seq, payload] for each batch from `start`, then the end marker [empty, -1, empty].
std::vector<uint64_t> replayed(void* dealer, uint64_t start) {
  std::string s(8, '\0');
  for (int i = 7; i >= 0; --i, start >>= 8) s[i] = static_cast<char>(start & 0xff);
  EXPECT_EQ(zmq_send(dealer, "", 0, ZMQ_SNDMORE), 0);
  EXPECT_EQ(zmq_send(dealer, s.data(), 8, 0), 8);
  std::vector<uint64_t> seqs;
  for (;;) {
    auto f = receive(dealer, 30000);  // megabytes of replay: slow under a sanitizer
    if (f.size() != 3) {
      ADD_FAILURE() << "a replay message of " << f.size() << " frames";
      return seqs;
    }
    EXPECT_TRUE(f[0].empty());
    if (f[1] == std::string(8, '\xff')) {
      EXPECT_TRUE(f[2].empty());
      return seqs;
    }
    seqs.push_back(sequence(f[1]));
  }
}

TEST(KvEventPublisherTest, ReplaySendsTheRingFromTheAskedSequenceThenTheEndMarker) {
  auto pub = open_publisher({.endpoint = "tcp://127.0.0.1:*",
                             .replay_endpoint = "tcp://127.0.0.1:*",
                             .max_batch_events = 1,
                             .replay_batches = 4});
  ASSERT_TRUE(pub);
  auto sink = pub->sink(KvMedium::kCpu);
  for (uint8_t n = 0; n < 6; ++n) {
    const OwnedEvent e = stored_event(n, KvMedium::kCpu);
    sink->stored(StoredBlock{e.hash, nullptr, e.token_ids, e.block_tokens, e.namespace_id});
  }
  ASSERT_TRUE(pub->flush());
  ZmqContext z;
  Socket dealer(z.ctx, ZMQ_DEALER);
  ASSERT_EQ(zmq_connect(dealer.s, pub->replay_endpoint().c_str()), 0);
  EXPECT_EQ(replayed(dealer.s, 3), (std::vector<uint64_t>{3, 4, 5}));
  EXPECT_EQ(replayed(dealer.s, 0), (std::vector<uint64_t>{2, 3, 4, 5}))
      << "the ring keeps the last 4";
  EXPECT_EQ(replayed(dealer.s, 9), std::vector<uint64_t>{});
  EXPECT_EQ(pub->metrics().replay_requests.value(), 3u);
  EXPECT_EQ(pub->metrics().replay_misses.value(), 1u);
  // A malformed request is counted and does not stop the socket.
  ASSERT_EQ(zmq_send(dealer.s, "", 0, ZMQ_SNDMORE), 0);
  ASSERT_EQ(zmq_send(dealer.s, "abc", 3, 0), 3);
  EXPECT_EQ(replayed(dealer.s, 5), std::vector<uint64_t>{5});
  EXPECT_EQ(pub->metrics().replay_malformed.value(), 1u);
}

TEST(KvEventPublisherTest, ASubscriberThatStopsReadingGetsBatchesHeldBackCountedAndInTheRing) {
  auto pub = open_publisher({.endpoint = "tcp://127.0.0.1:*",
                             .replay_endpoint = "tcp://127.0.0.1:*",
                             .queue_events = 1 << 20,
                             .max_batch_events = 2000,
                             .replay_batches = 100000,
                             .replay_bytes = 1ull << 30,
                             .send_hwm = 2});
  ASSERT_TRUE(pub);
  ZmqContext z;
  Socket sub(z.ctx, ZMQ_SUB);
  int hwm = 1;
  zmq_setsockopt(sub.s, ZMQ_RCVHWM, &hwm, sizeof(hwm));
  int buffer = 4096;  // a small kernel buffer, so the pipes fill with few batches
  zmq_setsockopt(sub.s, ZMQ_RCVBUF, &buffer, sizeof(buffer));
  ASSERT_EQ(zmq_connect(sub.s, pub->endpoint().c_str()), 0);
  ASSERT_EQ(zmq_setsockopt(sub.s, ZMQ_SUBSCRIBE, "", 0), 0);
  await_subscription(*pub, sub.s);
  // From here on it never reads. ~120 bytes an event: 200 batches of ~240 KB.
  auto sink = pub->sink(KvMedium::kCpu);
  const OwnedEvent e = stored_event(1, KvMedium::kCpu);
  uint64_t batches = 0;
  for (int round = 0; round < 200 && pub->metrics().batches_held_back.value() == 0; ++round) {
    for (int i = 0; i < 2000; ++i)
      sink->stored(StoredBlock{e.hash, &e.parent, e.token_ids, 16, e.namespace_id});
    ASSERT_TRUE(pub->flush(std::chrono::seconds(30)));
    ++batches;
  }
  const KvEventPublisherMetrics& m = pub->metrics();
  EXPECT_GT(m.batches_held_back.value(), 0u) << "after " << batches << " batches";
  // A batch holds what the queue had when the thread woke: at most 2000 events, fewer when a
  // slow run (a sanitizer's) let it wake in the middle of a round.
  EXPECT_GE(m.events_held_back.value(), m.batches_held_back.value());
  EXPECT_LE(m.events_held_back.value(), 2000 * m.batches_held_back.value());
  EXPECT_EQ(pub->queue().dropped_full(), 0u) << "the data path never waited and lost nothing";
  // Every held-back batch is still there for a subscriber that asks.
  Socket dealer(z.ctx, ZMQ_DEALER);
  ASSERT_EQ(zmq_connect(dealer.s, pub->replay_endpoint().c_str()), 0);
  const auto seqs = replayed(dealer.s, 0);
  EXPECT_EQ(seqs.size(), m.batches_sent.value() + m.batches_held_back.value());
}

TEST(KvEventPublisherTest, AnEndpointThatCannotBeBoundIsAClearError) {
  auto first = open_publisher(options_at("tcp://127.0.0.1:*"));
  ASSERT_TRUE(first);
  auto second = KvEventPublisher::open(options_at(first->endpoint()));
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find(first->endpoint()), std::string::npos)
      << second.status().message();
  EXPECT_FALSE(KvEventPublisher::open(options_at("nonsense")).ok());
}

}  // namespace
}  // namespace kvtier::testing
