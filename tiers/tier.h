// Tier: one level of storage for blocks, addressed by BlockHash. The GPU, RAM, SSD and remote
// (Redis Cluster) tiers implement it; TieredCache stacks them and wires each tier's evictions into
// the tier below.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "base/metrics/metrics.h"
#include "base/status.h"
#include "serialize/block.h"
#include "serialize/block_events.h"
#include "tiers/erase_fence.h"

namespace kvtier {

using BlockRef = std::shared_ptr<const Block>;

enum class InsertOutcome { kInserted, kAlreadyPresent };

// A block a read must return, with the token ids the request expects it to hold (checked by tiers
// whose contents may be stale or corrupt, and by TieredCache on every hit from below the top).
// Empty `tokens` means the caller knows only the hash (GET by hash): tokens are then not
// compared, and the block's own checks (checksums, hash) are all that vouch for it.
struct BlockRequest {
  BlockHash hash;
  std::span<const uint32_t> tokens;
  bool tokens_match(const std::vector<uint32_t>& held) const {
    return tokens.empty() || std::equal(held.begin(), held.end(), tokens.begin(), tokens.end());
  }
};

// Receives blocks a tier evicts. Called on the evicting caller's thread, after the tier has
// released its locks.
using EvictionSink = std::function<void(BlockRef)>;

// All methods are thread-safe unless an implementation says otherwise.
class Tier {
 public:
  virtual ~Tier() = default;

  virtual std::string_view name() const = 0;  // "gpu", "ram", "ssd", "remote"
  // A tier shared with other hosts over the network (below every local tier). TieredCache asks
  // it about many blocks at once, offers it blocks write-behind, and never probes it per block.
  virtual bool remote() const { return false; }
  // Reads wait on a disk or the network (milliseconds), not on memory: TieredCache::fetch_async
  // loads such blocks in the background.
  virtual bool reads_wait_on_io() const { return remote(); }
  // Whether blocks of `layout` can be stored here at all. A device tier holds its pool's layout
  // alone; a hybrid model's state records (serialize/state_record.h) pass it by.
  virtual bool accepts(const KvLayout&) const { return true; }

  // Stores `block` under its hash. kAlreadyPresent when the hash is held (contents are not
  // compared here: TieredCache checks tokens). Making room evicts other blocks to the sink.
  // kResourceExhausted when no room can be made (everything pinned); kInvalidArgument for a
  // block larger than the tier.
  virtual Result<InsertOutcome> insert(BlockRef block) = 0;
  // Several at once; tiers that move bytes batch them (the GPU tier: one upload, one scatter).
  virtual std::vector<Result<InsertOutcome>> insert_many(std::span<const BlockRef> blocks);
  virtual bool contains(const BlockHash& hash) const = 0;
  // contains() for many hashes; tiers behind a network answer them in one round trip.
  virtual std::vector<bool> contains_many(std::span<const BlockHash> hashes) const;

  // Whether the tier holds `request.hash`, and, where it can tell cheaply, whether the held block
  // carries the request's tokens (a difference under one hash is a collision or a forgery).
  enum class Presence { kAbsent, kSameTokens, kDifferentTokens, kUnverified };
  virtual Presence probe(const BlockRequest& request) const {
    return contains(request.hash) ? Presence::kUnverified : Presence::kAbsent;
  }
  // The block, or kNotFound. Tiers that verify contents report failures as kNotFound after
  // counting them (a corrupt or mismatched block is never returned).
  virtual Result<BlockRef> read(const BlockRequest& request) = 0;
  // Reads several blocks; tiers with real I/O issue them together. Results are in request order.
  virtual std::vector<Result<BlockRef>> read_many(std::span<const BlockRequest> requests);
  virtual bool erase(const BlockHash& hash) = 0;
  // erase(), saying when it could not be made to last: kIoError (an index the disk refused, a
  // store that did not answer), and the block may then still be held. Tiers whose erase cannot
  // fail answer erase().
  virtual Result<bool> erase_durably(const BlockHash& hash) { return erase(hash); }

  // A pinned block is never evicted. Pins nest. pin() is false when the block is absent.
  virtual bool pin(const BlockHash& hash) = 0;
  virtual void unpin(const BlockHash& hash) = 0;

  // For a device tier: where the block lives there (the GPU block id a block table names).
  virtual std::optional<int32_t> device_slot(const BlockHash&) const { return std::nullopt; }

  // pin(), probe() and device_slot() for each request, in request order. A device tier answers a
  // whole prefix in one pass (a GPU hit of thousands of blocks would otherwise take their locks
  // for each block, several times).
  struct PinResult {
    bool pinned = false;
    std::optional<int32_t> slot;
    // For a block with a slot, probe()'s answer once pinned (blocks read from the tier are checked
    // by what the read returns).
    Presence presence = Presence::kAbsent;
    // Where the tier hands its block out with the pin (RAM, under the same lock): what read()
    // would return, counted as read() counts it; the caller need not read it again.
    BlockRef block;
  };
  virtual std::vector<PinResult> pin_many(std::span<const BlockRequest> requests);
  // Gives back pin()'s pins.
  virtual void unpin_many(std::span<const BlockHash> hashes);
  // Gives back pin_many()'s pins, with the slots it answered (-1 where it gave none). The default
  // unpins by hash. A device tier gives the slots back as they are: its pin_many() keeps no books
  // by hash (for a GPU hit of hundreds of blocks a map entry each cost more than the pin), so its
  // pins are given back here and only here, and the slot is exact even if the hash was erased
  // and stored again meanwhile.
  virtual void unpin_pinned(std::span<const BlockHash> hashes, std::span<const int32_t> slots);

  virtual uint64_t capacity_bytes() const = 0;
  virtual uint64_t used_bytes() const = 0;
  virtual size_t block_count() const = 0;

  // Every metric of this tier, for the exporters. `labels` carries {tier="..."}.
  virtual void visit_metrics(MetricVisitor& visitor) const = 0;

  void set_eviction_sink(EvictionSink sink);
  // Where the tier tells of each block entering and leaving it (KV events; null: nowhere). Call
  // before the tier is shared. A tier made of other tiers, or keeping its books elsewhere (the GPU
  // pool, the SSD index), passes it on.
  virtual void set_block_events(std::shared_ptr<BlockEventSink> sink) { events_ = std::move(sink); }
  // Set by TieredCache before the tier is shared: inserts of blocks erased while a move carried
  // them are refused, and evictions count as moves (tiers/erase_fence.h).
  // A tier made of other tiers passes it on.
  virtual void set_erase_fence(std::shared_ptr<EraseFence> fence) { fence_ = std::move(fence); }

 protected:
  // True when `hash` must not be taken in (erased while in flight); counts the refusal. Call
  // under the lock the insert takes, so the erase of this tier and the insert are ordered.
  bool refuse_erased(const BlockHash& hash) const;
  // Begun before victims leave the tier's index; ends after evict_to_sink hands them down.
  EraseFence::Move begin_eviction() const { return fence_ ? fence_->begin_move() : EraseFence::Move(); }
  // Hands evicted blocks down; call without holding the tier's locks.
  void evict_to_sink(std::vector<BlockRef>& victims);
  // Tell the block events' sink, if any; call under the lock the change is made under.
  void announce_stored(const BlockIdentity& identity) const {
    if (events_) events_->stored(stored_block(identity));
  }
  void announce_removed(const BlockHash& hash) const {
    if (events_) events_->removed(hash);
  }

 private:
  mutable std::mutex sink_mu_;
  EvictionSink sink_;
  std::shared_ptr<EraseFence> fence_;
  std::shared_ptr<BlockEventSink> events_;
};

}  // namespace kvtier
