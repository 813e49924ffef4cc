// The remote tier against real Redis: a 3-master, 3-replica cluster on loopback shared by the
// tests of this binary (one CTest test, so the cluster starts once), plus standalone servers for
// auth and for a Redis that is down at start.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <thread>

#include "serialize/format/block_codec.h"
#include "tests/support/held_blocks.h"
#include "tests/support/redis_servers.h"
#include "tests/support/temp_dir.h"
#include "tests/support/test_blocks.h"
#include "tiers/remote/remote_tier.h"

namespace kvtier {
namespace {

using testing::RedisServers;
using testing::TempDir;

struct Cluster {
  TempDir dir;
  std::unique_ptr<RedisServers> servers;
};

Cluster& shared_cluster() {
  static Cluster* c = [] {
    auto* cl = new Cluster();
    std::string error;
    cl->servers = RedisServers::cluster(cl->dir.str(), 3, 1, &error);
    EXPECT_TRUE(cl->servers) << error;
    return cl;
  }();
  return *c;
}

std::shared_ptr<const LayoutRegistry> registry_for(const std::vector<std::shared_ptr<const KvLayout>>& layouts) {
  auto r = std::make_shared<LayoutRegistry>();
  for (const auto& l : layouts) EXPECT_TRUE(r->add(*l).ok());
  return r;
}

std::shared_ptr<const KvLayout> layout_of(DType d) {
  return testing::share(KvLayout::uniform(std::string("t-") + std::string(dtype_name(d)), 2, 2, 64, 16, d));
}

std::shared_ptr<RemoteTier> open_tier(const std::string& url, std::shared_ptr<const LayoutRegistry> layouts,
                                      std::string prefix = "kvtier-test:") {
  RemoteTierOptions o;
  auto address = RedisAddress::parse(url);
  EXPECT_TRUE(address.ok()) << address.status().to_string();
  o.address = *address;
  o.key_prefix = std::move(prefix);
  o.reconnect_backoff = std::chrono::milliseconds(100);
  auto t = RemoteTier::open(o, std::move(layouts));
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return t.ok() ? *t : nullptr;
}

BlockRef block(std::shared_ptr<const KvLayout> l, uint64_t seed) {
  return std::make_shared<const Block>(testing::make_block(l, seed, testing::Values::kWithSpecials));
}

BlockRequest request_for(const BlockRef& b) { return {b->hash(), b->identity().token_ids}; }

// A port where no Redis listens now (one was started there and stopped), or 0.
int free_redis_port(const TempDir& dir) {
  std::string error;
  auto probe = RedisServers::standalone(dir.str(), {}, &error);
  EXPECT_TRUE(probe) << error;
  return probe ? probe->ports().front() : 0;
}

TEST(RedisAddressTest, ParsesSeedsAndCredentials) {
  auto a = RedisAddress::parse("redis://alice:p%40ss@10.0.0.1:7000,10.0.0.2:7001");
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(a->user, "alice");
  EXPECT_EQ(a->password, "p@ss");
  ASSERT_EQ(a->seeds.size(), 2u);
  EXPECT_EQ(a->seeds[1].text(), "10.0.0.2:7001");
  EXPECT_EQ(a->redacted(), "redis://alice:***@10.0.0.1:7000,10.0.0.2:7001");
  EXPECT_EQ(RedisAddress::parse("redis://:secret@h:1")->password, "secret");
  EXPECT_FALSE(RedisAddress::parse("http://h:1").ok());
  EXPECT_FALSE(RedisAddress::parse("redis://h:99999").ok());
  EXPECT_FALSE(RedisAddress::parse("redis://").ok());
}

TEST(RedisKeySlotTest, MatchesRedisForKeysAndHashTags) {
  // Values from `CLUSTER KEYSLOT`.
  EXPECT_EQ(redis_key_slot("foo"), 12182);
  EXPECT_EQ(redis_key_slot("{user1000}.following"), redis_key_slot("user1000"));
  EXPECT_EQ(redis_key_slot("a{}b"), redis_key_slot("a{}b"));
}

TEST(RemoteTierTest, EveryDtypeRoundTripsBitExactAcrossTheCluster) {
  Cluster& c = shared_cluster();
  ASSERT_TRUE(c.servers);
  std::vector<std::shared_ptr<const KvLayout>> layouts{layout_of(DType::kF32), layout_of(DType::kF16),
                                                        layout_of(DType::kBF16)};
  auto writer = open_tier(c.servers->url(), registry_for(layouts));
  auto reader = open_tier(c.servers->url(), registry_for(layouts));  // another host
  std::vector<BlockRef> blocks;
  for (int i = 0; i < 48; ++i) blocks.push_back(block(layouts[i % 3], 1000 + i));
  for (const auto& b : blocks) ASSERT_TRUE(writer->insert(b).ok());
  writer->flush();
  EXPECT_EQ(writer->metrics().written_blocks.value(), 48u);
  std::vector<BlockRequest> reqs;
  for (const auto& b : blocks) reqs.push_back(request_for(b));
  auto got = reader->read_many(reqs);
  for (size_t i = 0; i < blocks.size(); ++i) {
    ASSERT_TRUE(got[i].ok()) << i << ": " << got[i].status().to_string();
    EXPECT_TRUE(testing::same_bytes(**got[i], *blocks[i])) << i;
  }
  EXPECT_EQ(reader->metrics().hits.value(), 48u);
  size_t nodes_used = 0;
  for (const auto& n : reader->cluster().node_stats()) nodes_used += n.bytes_in > 0;
  EXPECT_EQ(nodes_used, 3u) << "48 keys land on every master";
}

TEST(RemoteTierTest, AnEraseIsNotUndoneByAWriteBehindThatWasQueuedOrInFlight) {
  // Each block is erased right after it is offered: still queued, or in the batch being written.
  // Before, the erase's DEL went first and the write-behind's SET put the block back.
  Cluster& c = shared_cluster();
  ASSERT_TRUE(c.servers);
  auto l = layout_of(DType::kBF16);
  auto tier = open_tier(c.servers->url(), registry_for({l}), "kvtier-erase-race:");
  std::vector<BlockRef> blocks;
  for (int i = 0; i < 200; ++i) blocks.push_back(block(l, 5000 + i));
  for (const auto& b : blocks) {
    ASSERT_TRUE(tier->insert(b).ok());
    auto erased = tier->erase_durably(b->hash());
    ASSERT_TRUE(erased.ok()) << erased.status().to_string();
  }
  tier->flush();
  std::vector<BlockHash> hashes;
  for (const auto& b : blocks) hashes.push_back(b->hash());
  const std::vector<bool> held = tier->contains_many(hashes);
  EXPECT_EQ(std::count(held.begin(), held.end(), true), 0) << "erased blocks back in Redis";
}

TEST(RemoteTierTest, BlockEventsSayWhatThisHostWroteAndDeletedInOrder) {
  // A DELETE waits for the batch that was writing its block (RemoteWriteBehind::forget), so the
  // block's BlockStored, when it was written, comes before its BlockRemoved.
  Cluster& c = shared_cluster();
  ASSERT_TRUE(c.servers);
  auto l = layout_of(DType::kBF16);
  auto tier = open_tier(c.servers->url(), registry_for({l}), "kvtier-events:");
  auto events = std::make_shared<testing::HeldBlocks>();
  tier->set_block_events(events);
  std::vector<BlockRef> blocks;
  for (int i = 0; i < 120; ++i) {
    blocks.push_back(block(l, 9000 + i));
    ASSERT_TRUE(tier->insert(blocks.back()).ok());
    if (i % 3 == 0) {
      ASSERT_TRUE(tier->erase_durably(blocks.back()->hash()).ok());  // queued or in flight
    }
  }
  tier->flush();
  std::vector<BlockHash> hashes;
  for (const auto& b : blocks) hashes.push_back(b->hash());
  const std::vector<bool> held = tier->contains_many(hashes);
  std::set<BlockHash> in_redis;
  for (size_t i = 0; i < hashes.size(); ++i) {
    if (held[i]) in_redis.insert(hashes[i]);
  }
  EXPECT_EQ(in_redis.size(), 80u);
  EXPECT_EQ(events->snapshot(), in_redis);
  for (size_t i = 0; i < hashes.size(); i += 3)
    ASSERT_TRUE(tier->erase_durably(hashes[i + 1]).ok());
  for (size_t i = 0; i < hashes.size(); i += 3) in_redis.erase(hashes[i + 1]);
  EXPECT_EQ(events->snapshot(), in_redis);
}

TEST(RemoteTierTest, ContainsManyAnswersForEveryNodeInOneBatch) {
  Cluster& c = shared_cluster();
  ASSERT_TRUE(c.servers);
  auto l = layout_of(DType::kBF16);
  auto tier = open_tier(c.servers->url(), registry_for({l}));
  std::vector<BlockHash> hashes;
  for (int i = 0; i < 64; ++i) {
    BlockRef b = block(l, 2000 + i);
    hashes.push_back(b->hash());
    if (i % 2 == 0) {
      ASSERT_TRUE(tier->insert(b).ok());
    }
  }
  tier->flush();
  const std::vector<bool> has = tier->contains_many(hashes);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(has[i], i % 2 == 0) << i;
  EXPECT_EQ(tier->metrics().exists_seconds.snapshot().count, 1u) << "one batch";
}

TEST(RemoteTierTest, AValueThatFailsItsChecksIsRefusedDeletedAndCounted) {
  Cluster& c = shared_cluster();
  ASSERT_TRUE(c.servers);
  auto l = layout_of(DType::kBF16);
  auto tier = open_tier(c.servers->url(), registry_for({l}));
  BlockRef good = block(l, 3000), other = block(l, 3001), garbage = block(l, 3002);
  ASSERT_TRUE(tier->insert(good).ok());
  ASSERT_TRUE(tier->insert(other).ok());
  tier->flush();
  // Flip one byte of `good`'s stored frame; store `other`'s frame under `garbage`'s key.
  BlockCodec codec;
  Bytes frame;
  ASSERT_TRUE(codec.encode(*good, frame).ok());
  // Large enough to be received in place and adopted as the block's storage: the flipped byte
  // must be caught before the buffer is adopted.
  ASSERT_GE(frame.size(), RespReaderOptions{}.large_string_bytes);
  frame[frame.size() / 2] ^= 0x20;
  Bytes other_frame;
  ASSERT_TRUE(codec.encode(*other, other_frame).ok());
  auto set = [&](const BlockHash& h, const Bytes& v) {
    const std::string key = tier->key_of(h);
    RedisCommand cmd{"SET", key, {reinterpret_cast<const char*>(v.data()), v.size()}};
    auto r = tier->cluster().execute(std::vector<RedisCommand>{cmd});
    ASSERT_TRUE(r.front().ok() && r.front()->is_status());
  };
  set(good->hash(), frame);
  set(garbage->hash(), other_frame);
  EXPECT_FALSE(tier->read(request_for(good)).ok());
  EXPECT_FALSE(tier->read(request_for(garbage)).ok()) << "a valid frame of another block";
  EXPECT_EQ(tier->metrics().corrupt.value(), 2u);
  EXPECT_FALSE(tier->contains(good->hash())) << "deleted";
  EXPECT_FALSE(tier->contains(garbage->hash()));
  auto still = tier->read(request_for(other));
  ASSERT_TRUE(still.ok());
  EXPECT_TRUE(testing::same_bytes(**still, *other));
  // A request with other tokens is never served either.
  std::vector<uint32_t> wrong(16, 7);
  EXPECT_FALSE(tier->read({other->hash(), wrong}).ok());
}

// Moves `key`'s slot from its master to another, by hand, as `redis-cli --cluster reshard` does.
// With `finish` false the slot stays MIGRATING on the old owner (whose answer is then ASK).
void migrate(RedisServers& s, const std::string& key, int from, int to, bool finish) {
  const std::string slot = s.cli(from, {"CLUSTER", "KEYSLOT", key});
  auto id = [&](int port) {
    std::string out = s.cli(port, {"CLUSTER", "MYID"});
    return out.substr(0, out.find('\n'));
  };
  const std::string slot_n = slot.substr(0, slot.find('\n'));
  s.cli(to, {"CLUSTER", "SETSLOT", slot_n, "IMPORTING", id(from)});
  s.cli(from, {"CLUSTER", "SETSLOT", slot_n, "MIGRATING", id(to)});
  s.cli(from, {"MIGRATE", "127.0.0.1", std::to_string(to), "", "0", "5000", "KEYS", key});
  if (!finish) return;
  for (int p : s.ports()) s.cli(p, {"CLUSTER", "SETSLOT", slot_n, "NODE", id(to)});
}

TEST(RemoteTierTest, MovedAndAskRedirectsAreFollowed) {
  Cluster& c = shared_cluster();
  ASSERT_TRUE(c.servers);
  auto l = layout_of(DType::kBF16);
  auto tier = open_tier(c.servers->url(), registry_for({l}));
  BlockRef moved = block(l, 4000), asked = block(l, 4001);
  ASSERT_TRUE(tier->insert(moved).ok());
  ASSERT_TRUE(tier->insert(asked).ok());
  tier->flush();
  ASSERT_TRUE(tier->read(request_for(moved)).ok());  // the client now knows the current map
  auto other_master = [&](int port) {
    for (int p : c.servers->ports()) {
      const std::string role = c.servers->cli(p, {"ROLE"});
      if (p != port && role.rfind("master", 0) == 0) return p;
    }
    return 0;
  };
  const std::string mk = tier->key_of(moved->hash()), ak = tier->key_of(asked->hash());
  const int m_from = c.servers->master_port_for(mk);
  migrate(*c.servers, mk, m_from, other_master(m_from), /*finish=*/true);
  const int a_from = c.servers->master_port_for(ak);
  migrate(*c.servers, ak, a_from, other_master(a_from), /*finish=*/false);
  auto got = tier->read_many(std::vector<BlockRequest>{request_for(moved), request_for(asked)});
  ASSERT_TRUE(got[0].ok()) << "MOVED followed: " << got[0].status().to_string();
  ASSERT_TRUE(got[1].ok()) << "ASK followed: " << got[1].status().to_string();
  EXPECT_TRUE(testing::same_bytes(**got[0], *moved));
  EXPECT_TRUE(testing::same_bytes(**got[1], *asked));
}

TEST(RemoteTierTest, ARedisDownAtStartIsAMissUntilItComesBack) {
  TempDir dir;
  std::string error;
  const int port = free_redis_port(dir);
  ASSERT_GT(port, 0);
  auto l = layout_of(DType::kF16);
  auto tier = open_tier("redis://127.0.0.1:" + std::to_string(port), registry_for({l}));
  ASSERT_TRUE(tier);
  BlockRef b = block(l, 5000);
  EXPECT_FALSE(tier->read(request_for(b)).ok());
  EXPECT_GT(tier->metrics().read_errors.value(), 0u);
  ASSERT_TRUE(tier->insert(b).ok());
  tier->flush();
  EXPECT_GT(tier->metrics().write_errors.value(), 0u) << "counted, not lost silently";
  // The server comes up on that port: the tier finds it again.
  auto later = RedisServers::standalone(dir.str(), {}, &error, port);
  ASSERT_TRUE(later) << error;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  bool hit = false;
  while (!hit && std::chrono::steady_clock::now() < deadline) {
    ASSERT_TRUE(tier->insert(b).ok());
    tier->flush();
    hit = tier->read(request_for(b)).ok();
    if (!hit) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_TRUE(hit);
  EXPECT_TRUE(tier->cluster().standalone());
}

// A block whose SET failed while Redis was down reaches Redis once it is back, without being
// offered again: another host reads it then.
TEST(RemoteTierTest, AWriteThatFailedDuringAnOutageIsWrittenWhenRedisIsBack) {
  TempDir dir;
  std::string error;
  const int port = free_redis_port(dir);
  ASSERT_GT(port, 0);
  auto l = layout_of(DType::kBF16);
  const std::string url = "redis://127.0.0.1:" + std::to_string(port);
  auto tier = open_tier(url, registry_for({l}));
  ASSERT_TRUE(tier);
  BlockRef b = block(l, 6000);
  ASSERT_TRUE(tier->insert(b).ok());
  tier->flush();
  EXPECT_GT(tier->metrics().write_errors.value(), 0u);
  EXPECT_EQ(tier->metrics().retry_blocks.value(), 1);
  auto later = RedisServers::standalone(dir.str(), {}, &error, port);
  ASSERT_TRUE(later) << error;
  auto other = open_tier(url, registry_for({l}));  // another host: it never saw the block
  ASSERT_TRUE(other);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  Result<BlockRef> got = not_found("not yet");
  while (!got.ok() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    got = other->read(request_for(b));
  }
  ASSERT_TRUE(got.ok()) << "the failed write was retried";
  EXPECT_TRUE(testing::same_bytes(**got, *b));
  EXPECT_EQ(tier->metrics().retried_written.value(), 1u);
  EXPECT_EQ(tier->metrics().retry_blocks.value(), 0);
}

TEST(RemoteTierTest, AFailedWriteIsDroppedWithAReasonOnceNoLocalTierHoldsItOrItsWindowEnds) {
  TempDir dir;
  const int port = free_redis_port(dir);
  ASSERT_GT(port, 0);
  const std::string url = "redis://127.0.0.1:" + std::to_string(port);
  auto l = layout_of(DType::kBF16);
  RemoteTierOptions o;
  o.address = *RedisAddress::parse(url);
  o.reconnect_backoff = std::chrono::milliseconds(50);
  o.retry_backoff = std::chrono::milliseconds(20);
  o.write_retry_window = std::chrono::milliseconds(300);
  auto expiring = RemoteTier::open(o, registry_for({l}));
  ASSERT_TRUE(expiring.ok());
  ASSERT_TRUE((*expiring)->insert(block(l, 6100)).ok());
  o.write_retry_window = std::chrono::minutes(5);
  auto forgotten = RemoteTier::open(o, registry_for({l}));
  ASSERT_TRUE(forgotten.ok());
  (*forgotten)->set_held_locally([](const BlockHash&) { return false; });
  ASSERT_TRUE((*forgotten)->insert(block(l, 6101)).ok());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (((*expiring)->metrics().dropped_retries_expired.value() == 0 ||
          (*forgotten)->metrics().dropped_not_held_locally.value() == 0) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ((*expiring)->metrics().dropped_retries_expired.value(), 1u);
  EXPECT_EQ((*forgotten)->metrics().dropped_not_held_locally.value(), 1u);
  EXPECT_EQ((*expiring)->metrics().retry_blocks.value(), 0);
  EXPECT_EQ((*forgotten)->metrics().retry_blocks.value(), 0);
}

TEST(RemoteTierTest, PasswordsAndAclUsersAuthenticateAndAWrongOneFailsAtOpen) {
  TempDir dir;
  std::string error;
  auto s = RedisServers::standalone(dir.str(), {"--requirepass", "sekret", "--user", "alice", "on", ">wonderland",
                                                "~*", "&*", "+@all"},
                                    &error);
  ASSERT_TRUE(s) << error;
  auto l = layout_of(DType::kBF16);
  BlockRef b = block(l, 6000);
  for (const auto& [user, pass] : std::vector<std::pair<std::string, std::string>>{{"", "sekret"}, {"alice", "wonderland"}}) {
    auto tier = open_tier(s->url(user, pass), registry_for({l}), "kvtier-" + user + ":");
    ASSERT_TRUE(tier);
    ASSERT_TRUE(tier->insert(b).ok());
    tier->flush();
    EXPECT_TRUE(tier->read(request_for(b)).ok()) << user;
  }
  RemoteTierOptions o;
  o.address = *RedisAddress::parse(s->url("alice", "queen-of-hearts"));
  auto bad = RemoteTier::open(o, registry_for({l}));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(bad.status().message().find("refused the credentials of user 'alice'"), std::string::npos)
      << bad.status().message();
}

}  // namespace
}  // namespace kvtier
