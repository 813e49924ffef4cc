// TieredCache: the library's front door. It stacks tiers (GPU above RAM above SSD above a remote
// tier shared with other hosts, or any subset) and answers three questions: how much of this
// prompt is cached (lookup), keep these computed blocks (insert), and give me these blocks for use
// (fetch: promote them to the top tier and pin them until released). Evictions cascade tier by
// tier; what falls off the last local tier is dropped and counted. A shared (remote) tier gets
// every published or spilled block write-behind and is asked about the rest of a chain in one batch.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/log.h"
#include "cache/cache_metrics.h"
#include "cache/eviction_cascade.h"
#include "cache/plan/hit_cost_model.h"
#include "cache/prefix_hasher.h"
#include "cache/prefix_match.h"
#include "tiers/policy/admission_policy.h"
#include "tiers/tier.h"

namespace kvtier {

struct LookupResult {
  size_t matched_tokens = 0;
  struct Hit {
    BlockHash hash;
    int tier = 0;  // index into the cache's tiers
  };
  std::vector<Hit> blocks;  // the longest cached prefix, in order
};

class TieredCache;

// Whether a fetch's duration teaches the cost model its tiers' restore rates.
enum class FetchTiming { kTimed, kUntimed };
// Where fetch_async() runs a fetch that needs no disk or network.
enum class FetchThread { kWhenItWaits, kAlways };

// Blocks handed out by fetch(), pinned in the top tier until this is destroyed. Movable.
class PinnedBlocks {
 public:
  struct Entry {
    BlockHash hash;
    BlockRef block;         // the block's bytes on the host; null for a block served from a
                            // device tier (its bytes are there, at device_slot)
    int source_tier = 0;    // where it was found
    bool pinned = false;    // false only when the top tier had no room to promote it
    int32_t device_slot = -1;  // the GPU block id when the top tier is the GPU
  };
  PinnedBlocks() = default;
  ~PinnedBlocks();
  PinnedBlocks(PinnedBlocks&&) noexcept = default;
  PinnedBlocks& operator=(PinnedBlocks&& o) noexcept;
  PinnedBlocks(const PinnedBlocks&) = delete;
  PinnedBlocks& operator=(const PinnedBlocks&) = delete;

  const std::vector<Entry>& entries() const { return entries_; }
  size_t size() const { return entries_.size(); }
  void release();

 private:
  friend class TieredCache;
  std::shared_ptr<Tier> top_;
  std::vector<Entry> entries_;
};

// What fetch_async returns: the pinned prefix, at once when every block was in memory, or when
// its load from a slower tier finishes. Movable. Dropped before it is waited on, the load still
// finishes and its blocks are unpinned then.
class PendingFetch {
 public:
  PendingFetch() = default;
  // True once wait() would not block.
  bool ready() const;
  // Whether the blocks are being loaded off the caller's thread.
  bool in_background() const { return later_.valid(); }
  // Waits for the load, if any, and hands the pinned blocks over. Once; afterwards empty.
  PinnedBlocks wait();
  // Waits until the load is in or `deadline` passes; true when wait() would not block.
  bool wait_until(std::chrono::steady_clock::time_point deadline) const;

 private:
  friend class TieredCache;
  std::optional<PinnedBlocks> now_;
  std::future<PinnedBlocks> later_;
};

class FetchLoader;

// Thread-safe: tiers are thread-safe and the cache holds no lock of its own.
class TieredCache {
 public:
  // `tiers` top first; at most kMaxTiers.
  explicit TieredCache(std::vector<std::shared_ptr<Tier>> tiers);
  ~TieredCache();

  const std::vector<std::shared_ptr<Tier>>& tiers() const { return tiers_; }
  // Blocks evicted into tier `tier` (the SSD) must pass `policy` first; it hears of every use
  // (publish, fetch). Call before the cache is shared between threads.
  void set_admission(size_t tier, std::unique_ptr<AdmissionPolicy> policy);

  // The longest prefix of full blocks present in any tier; stops at the first missing block.
  LookupResult lookup(const PrefixHasher& hasher, std::span<const uint32_t> tokens,
                      std::span<const std::string> extra_keys);
  // `prompt_tokens`: how many tokens the prompt had (its tail short of a block included), for
  // kvtier_lookup_tokens_total; nullopt counts the keys' tokens.
  LookupResult lookup(std::span<const BlockKey> keys,
                      std::optional<size_t> prompt_tokens = std::nullopt);
  // lookup() of a request about to be served, with fetch() of the longest prefix the top tier
  // holds in the same pass: those blocks are used where they lie whatever a hit plan decides (a
  // GPU hit), so they are pinned as they are found, their tokens compared, and only the rest of
  // the chain is looked for below. `on_top` is what fetch(keys.first(n), found) would return for
  // those n blocks; `found` the whole prefix, ending at a top-tier block with other tokens (not
  // served). With the GPU on top a hit of 511 blocks is then one pass over the pool, not two.
  // With `look_below`, asked after the top tier's pass how many leading blocks it pinned: false
  // leaves the tiers below unasked (`stopped_at_top`; counted), for a caller whose plan could use
  // nothing they hold, and `found` is then the top tier's prefix alone.
  struct PinnedLookup {
    LookupResult found;
    PinnedBlocks on_top;
    bool stopped_at_top = false;
  };
  PinnedLookup lookup_pinning_top(std::span<const BlockKey> keys,
                                  const std::function<bool(size_t on_top)>& look_below = {});
  // The highest local tier holding `hash` (its index in tiers()), or -1.
  int tier_holding(const BlockHash& hash) const;
  // Whether any local tier holds `request.hash`: what the highest one says (kSameTokens,
  // kDifferentTokens, kUnverified), or kAbsent. Lets a caller skip building a block it has.
  Tier::Presence presence(const BlockRequest& request) const;

  // Publishes a computed block into the top tier (or, if it has no room, the first tier below
  // that takes it). A hash already held with the same tokens is a no-op (kAlreadyPresent); with
  // different tokens it is a collision: kConflict, counted and logged, nothing changes.
  Result<InsertOutcome> insert(BlockRef block);

  // Returns the blocks of `keys` (a prefix, in order), promoted into the top tier and pinned there.
  // Every block's tokens are compared with the request's. Stops at the first block no tier can
  // return intact; the result holds the blocks before it. With the GPU on top, hits there are
  // pinned in place (no copy) and blocks from below are uploaded in one batch.
  PinnedBlocks fetch(std::span<const BlockKey> keys);
  // fetch() of the first keys.size() blocks a lookup() of these keys just `found`, without
  // locating them again (a block moved since is read where it went, as in fetch()).
  PinnedBlocks fetch(std::span<const BlockKey> keys, const LookupResult& found);
  // fetch() without waiting on a disk or the network: when any block of the prefix lies in such a
  // tier (the SSD, a remote tier), the whole fetch runs on a loader thread and the caller polls or
  // waits on the handle; otherwise it runs now. The prefix is located again when the load starts,
  // so a block evicted or erased meanwhile ends it there, as in fetch(). `keys` (and the tokens
  // they point at) are copied. FetchThread::kAlways: on a loader thread even from memory (a caller
  // that computes meanwhile, as a hit plan does). FetchTiming::kUntimed for a load that shares the
  // GPU with the caller's compute: its time would charge the compute to the tier.
  PendingFetch fetch_async(std::span<const BlockKey> keys, FetchThread thread = FetchThread::kWhenItWaits,
                           FetchTiming timing = FetchTiming::kTimed);

  // One record read where it lies, without pinning: the highest local tier holding it, else the
  // shared tiers. Its tokens are compared with the request's; one read from below the highest
  // local tier that accepts its layout is copied up there (a state record skips the GPU). For
  // records used once per hit, as a hybrid model's state snapshots are. kNotFound when no tier
  // returns it intact (counted as the tiers count their failures, and as a token mismatch here).
  Result<BlockRef> read_record(const BlockRequest& request);

  // Removes a block from every tier. True if any tier held it. Final: a move that was carrying
  // the block (a prefetch, a promotion, an eviction) does not put it back (tiers/erase_fence.h);
  // only a later insert() does. An error when a tier could not make it last (an SSD index the
  // disk refused, a remote store that did not answer): every other tier let it go.
  Result<bool> erase(const BlockHash& hash);
  // Called with each block that falls off the last local tier (evicted, not admitted, refused)
  // and that no shared tier took: the end of its life here. On the evicting thread, without the
  // tiers' locks. Removing one waits for its calls in flight.
  using DropListener = EvictionCascade::DropListener;
  size_t add_drop_listener(DropListener listener);
  void remove_drop_listener(size_t id);

  const CacheMetrics& metrics() const { return metrics_; }
  const EraseFence& erase_fence() const { return *fence_; }
  // For a caller that copies blocks between the tiers itself: begun before it reads them, so an
  // erase meanwhile makes the tiers refuse them.
  EraseFence::Move begin_move() { return fence_->begin_move(); }
  // What restores cost, learned from every fetch that moved blocks up (and, from an engine that
  // reports them, its prefills): what hit plans and /v1/lookup's estimates are made of.
  HitCostModel& costs() { return costs_; }
  const HitCostModel& costs() const { return costs_; }
  // erase() for a caller that may act only in namespace `ns` (a tenant's DELETE by hash). Another
  // namespace's block is left alone and must look exactly like an absent one (kForeign). The
  // namespace is read where the block lies, not fetched (a fetch would promote it only to delete
  // it). A block no tier can read at that moment — absent, or moving inside a tier, as the SSD
  // moves a block out of a segment it reclaims — is erased all the same, so the move cannot bring
  // it back (kAbsent): taken for another's, such a block was once left alone and came back after
  // its DELETE was answered.
  enum class ScopedErase { kErased, kAbsent, kForeign };
  Result<ScopedErase> erase_in(std::string_view ns, const BlockHash& hash);
  // `found` as the doors answer it: tier names, and per tier below the top one that holds blocks
  // of it the predicted seconds to bring them up (nullopt while the tier's rate is not known
  // yet) — what an engine we do not run needs to choose between loading and computing, as
  // cache/plan/hit_planner.h does for ours.
  PrefixMatch describe(const LookupResult& found, uint64_t block_bytes) const;
  // Cache metrics, then every tier's.
  void visit_metrics(MetricVisitor& visitor) const;

 private:
  // The tier of each block of the longest cached prefix of `keys`: local tiers block by block,
  // then the shared tiers about the rest of the chain in one batch.
  std::vector<int> locate(std::span<const BlockKey> keys) const;
  // Counts a lookup and its prompt's tokens (nullopt: the keys' tokens).
  void count_lookup(std::span<const BlockKey> keys, std::optional<size_t> prompt_tokens);
  // The lookup's answer for blocks found in tiers `where`, counted in the hit metrics.
  LookupResult found_in(std::span<const BlockKey> keys, std::span<const int> where);
  PinnedBlocks fetch_located(std::span<const BlockKey> keys, std::vector<int> where,
                             FetchTiming timing = FetchTiming::kTimed);
  class PrefixFetch;  // one fetch_located()'s reads, checks and promotions
  // Teaches the cost model what restoring `fetched` cost since `started`.
  void charge_restore(const PinnedBlocks& fetched, std::chrono::steady_clock::time_point started);
  // The tier that holds `hash` now (top first, `skip` left out), or -1.
  int relocate(const BlockHash& hash, int skip) const;
  // A block locate() found in `tier` is in no tier at read: counted and logged, a miss.
  void gone(const BlockHash& hash, size_t tier);

  std::vector<std::shared_ptr<Tier>> tiers_;
  // Keeps an erase final against the moves in flight (promotions, prefetches, evictions).
  std::shared_ptr<EraseFence> fence_ = std::make_shared<EraseFence>();
  CacheMetrics metrics_;
  HitCostModel costs_;
  EvictionCascade cascade_{tiers_, metrics_, *fence_};
  LogThrottle drop_log_;
  LogThrottle collision_log_;
  LogThrottle mismatch_log_;
  LogThrottle read_failure_log_;
  std::mutex loader_mu_;  // guards creating loader_
  std::unique_ptr<FetchLoader> loader_;  // started by the first fetch that needs it
};

}  // namespace kvtier
