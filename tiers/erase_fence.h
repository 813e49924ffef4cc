// EraseFence: makes an acknowledged erase final against every block move in flight.
//
// A move copies a block from one tier into another: a promotion or prefetch reads it below and
// inserts it above, an eviction takes it out of one tier and hands it to the next. A move that
// picked a block up before an erase reached that tier would otherwise put it back after the erase
// passed, and the deleted block would be served again (a prefetch racing DELETE did exactly that).
//
// The rule: an erase leaves a tombstone for its hash from before it touches the first tier until
// no move that began before it had finished is still in flight. Every tier refuses to insert a
// tombstoned hash, checked under the same lock its insert takes, so the refusal and the erase of
// that tier are ordered: an insert before the erase is removed by it, one after it is refused.
// A move therefore begins (begin_move) before it reads or takes its block, and an erase's
// tombstone lasts until every move older than its end has ended. A client's fresh write of the
// same block (PUT after DELETE) lifts the tombstone: the block is live again.
//
// Thread-safe. Tombstones are few (one per erase in the last moves' lifetime) and pruned as moves
// end; with none, blocks() costs one atomic load.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <mutex>
#include <set>
#include <unordered_map>

#include "base/metrics/metrics.h"
#include "serialize/block_hash.h"

namespace kvtier {

class EraseFence {
 public:
  // A move in flight; ends when destroyed. Movable.
  class Move {
   public:
    Move() = default;
    Move(Move&& o) noexcept : fence_(o.fence_), ticket_(o.ticket_) { o.fence_ = nullptr; }
    Move& operator=(Move&& o) noexcept;
    Move(const Move&) = delete;
    Move& operator=(const Move&) = delete;
    ~Move() { end(); }
    void end();

   private:
    friend class EraseFence;
    Move(EraseFence* fence, uint64_t ticket) : fence_(fence), ticket_(ticket) {}
    EraseFence* fence_ = nullptr;
    uint64_t ticket_ = 0;
  };
  // An erase in progress: the tombstone is set when it is made and starts to age when it is
  // destroyed (after every tier was erased).
  class Erasure {
   public:
    Erasure(const Erasure&) = delete;
    Erasure& operator=(const Erasure&) = delete;
    ~Erasure();

   private:
    friend class EraseFence;
    Erasure(EraseFence* fence, const BlockHash& hash) : fence_(fence), hash_(hash) {}
    EraseFence* fence_;
    BlockHash hash_;
  };

  Move begin_move();
  [[nodiscard]] Erasure begin_erase(const BlockHash& hash);
  // A fresh write of `hash` by a client: the block is live again.
  void revive(const BlockHash& hash);
  // True while `hash` is tombstoned: a tier must not take it in. Call under the tier's lock.
  bool blocks(const BlockHash& hash) const;

  size_t tombstones() const { return count_.load(std::memory_order_acquire); }
  size_t moves_in_flight() const;
  // Inserts refused because their block had been erased while they were carried.
  Counter refused;

 private:
  struct Tombstone {
    uint32_t erasing = 0;  // erases of this hash still passing over the tiers
    uint64_t settled = 0;  // the epoch the last of them ended at
  };
  void end_move(uint64_t ticket);
  void end_erase(const BlockHash& hash);
  void prune_locked();

  mutable std::mutex mu_;
  uint64_t epoch_ = 0;
  std::set<uint64_t> in_flight_;
  std::unordered_map<BlockHash, Tombstone> tombs_;
  std::deque<std::pair<uint64_t, BlockHash>> aging_;  // settled tombstones, oldest first
  std::atomic<size_t> count_{0};
};

}  // namespace kvtier
