// TieredCache's fetch path: pinning a prefix where it lies, reading what lies below, promoting it
// slice by slice into the top tier. The rest of the class is in tiered_cache.cc.
#include <algorithm>
#include <array>
#include <chrono>
#include <deque>

#include <spdlog/spdlog.h>

#include "base/elapsed.h"
#include "base/threads/worker_pool.h"
#include "cache/tiered_cache.h"

namespace kvtier {

PinnedBlocks TieredCache::fetch(std::span<const BlockKey> keys) {
  // Where each block is, top tier first; the prefix ends at the first block no tier holds.
  return fetch_located(keys, locate(keys));
}

PinnedBlocks TieredCache::fetch(std::span<const BlockKey> keys, const LookupResult& found) {
  std::vector<int> where;
  const size_t n = std::min(keys.size(), found.blocks.size());
  where.reserve(n);
  for (size_t i = 0; i < n && found.blocks[i].hash == keys[i].hash; ++i) where.push_back(found.blocks[i].tier);
  return fetch_located(keys.first(where.size()), std::move(where));
}

int TieredCache::relocate(const BlockHash& hash, int skip) const {
  for (size_t t = 0; t < tiers_.size(); ++t) {
    if (static_cast<int>(t) != skip && tiers_[t]->contains(hash)) return static_cast<int>(t);
  }
  return -1;
}

// One fetch_located(): the prefix's blocks in the top tier pinned where they lie, the ones below
// read slice by slice and promoted into the top tier, the prefix cut at its first block that fails
// a read or a check.
//
// Blocks from lower tiers are read and promoted slice by slice, the next slices read (on other
// threads) while one is checked and promoted, so a long prefix's upload to the GPU overlaps the
// SSD's reads and nothing waits for the whole prefix to be in memory. Within a slice each lower
// tier's blocks are read together (the SSD tier issues them as one batch). The first slice is
// small so the first upload starts early; later ones carry about slice_bytes_.
class TieredCache::PrefixFetch {
 public:
  PrefixFetch(TieredCache& cache, std::span<const BlockKey> keys, std::vector<int> where)
      : c_(cache),
        top_(*cache.tiers_.front()),
        keys_(keys),
        where_(std::move(where)),
        blocks_(where_.size()),
        failed_(where_.size(), 0),
        top_pinned_(where_.size(), false),
        top_presence_(where_.size(), Tier::Presence::kAbsent),
        top_slot_(where_.size(), -1) {}

  // Pins the top tier's blocks, all in one call, so none can be evicted between the check and the
  // use; a device tier's answer carries each block's slot and token check.
  void pin_top();
  // Reads, checks and promotes slice after slice into `out`, up to the first block that fails.
  void read_and_promote(std::vector<PinnedBlocks::Entry>& out);
  // Gives back the pins taken past `end`, where the prefix broke.
  void unpin_from(size_t end);

 private:
  // The slice sizes: larger where nothing waits on I/O, one slice for a shared tier alone.
  void size_slices();
  void read_slice(size_t a, size_t b);
  // The end of the slice that starts at `a` and holds up to `lower` blocks from lower tiers.
  size_t slice_end(size_t a, size_t lower) const;
  // The first block of [a, b) not to serve (its read failed, or it holds other tokens), or b.
  size_t check_slice(size_t a, size_t b);
  // Promotes blocks [a, end) that lie below the top tier, in one call, and hands out [a, end).
  void promote_slice(size_t a, size_t end, std::vector<PinnedBlocks::Entry>& out);

  TieredCache& c_;
  Tier& top_;
  std::span<const BlockKey> keys_;
  std::vector<int> where_;
  std::vector<BlockRef> blocks_;
  // Bytes, not vector<bool>'s packed bits: a slice read on another thread sets its own entries.
  std::vector<uint8_t> failed_;
  std::vector<bool> top_pinned_;
  std::vector<Tier::Presence> top_presence_;
  std::vector<int32_t> top_slot_;
  bool any_io_ = false;
  uint64_t slice_bytes_ = 0;
  size_t first_slice_ = 0;
};

void TieredCache::PrefixFetch::pin_top() {
  std::vector<BlockRequest> requests;
  std::vector<size_t> at;
  for (size_t i = 0; i < where_.size(); ++i) {
    if (where_[i] != 0) continue;
    requests.push_back({keys_[i].hash, keys_[i].tokens});
    at.push_back(i);
  }
  const std::vector<Tier::PinResult> pins = top_.pin_many(requests);
  for (size_t k = 0; k < at.size(); ++k) {
    const size_t i = at[k];
    if (!pins[k].pinned) {
      // Evicted since locate(): on its way down (still readable here, unpinned) or below now.
      if (auto r = top_.read({keys_[i].hash, keys_[i].tokens}); r.ok()) {
        blocks_[i] = *r;
        c_.metrics_.relocated.inc();
      } else if (const int now = c_.relocate(keys_[i].hash, 0); now > 0) {
        where_[i] = now;
        c_.metrics_.relocated.inc();
      } else {
        failed_[i] = 1;
        c_.gone(keys_[i].hash, 0);
      }
      continue;
    }
    top_pinned_[i] = true;
    if (pins[k].slot) {  // device tier: no copy
      top_slot_[i] = *pins[k].slot;
      top_presence_[i] = pins[k].presence;
      continue;
    }
    if (pins[k].block) {  // read with its pin
      blocks_[i] = pins[k].block;
      continue;
    }
    auto r = top_.read({keys_[i].hash, keys_[i].tokens});
    if (r.ok()) blocks_[i] = *r;
    else failed_[i] = 1;
  }
}

void TieredCache::PrefixFetch::size_slices() {
  // When no block waits on I/O (RAM only) there is nothing to overlap: slices are then read on
  // this thread and 4x larger, because each one costs a submission and a wait. Measured on the
  // H100 host (e2e_bench, 256 MiB and 1 GiB Llama-3-8B prefixes from RAM, two rounds): 64 MiB
  // slices reached 0.72-0.82 of the bus, one slice for the whole prefix 0.83-0.92.
  const auto& tiers = c_.tiers_;
  for (size_t i = 0; i < where_.size() && !any_io_; ++i) {
    any_io_ = where_[i] > 0 && tiers[where_[i]]->reads_wait_on_io();
  }
  // A prefix only a shared (Redis) tier holds is one slice: slices drain each node's pipeline
  // and cannot overlap (they hold the per-node connections); measured in docs/benchmarks.md.
  bool only_shared = any_io_;
  for (size_t i = 0; i < where_.size() && only_shared; ++i) only_shared = where_[i] <= 0 || tiers[where_[i]]->remote();
  slice_bytes_ = only_shared ? UINT64_MAX : any_io_ ? 64ull << 20 : 256ull << 20;
  first_slice_ = only_shared ? where_.size() : any_io_ ? 16 : 64;
}

void TieredCache::PrefixFetch::read_slice(size_t a, size_t b) {
  const auto& tiers = c_.tiers_;
  for (size_t t = 1; t < tiers.size(); ++t) {
    std::vector<BlockRequest> reqs;
    std::vector<size_t> idx;
    for (size_t i = a; i < b; ++i) {
      if (where_[i] == static_cast<int>(t)) {
        reqs.push_back({keys_[i].hash, keys_[i].tokens});
        idx.push_back(i);
      }
    }
    if (reqs.empty()) continue;
    std::vector<Result<BlockRef>> got = tiers[t]->read_many(reqs);
    for (size_t j = 0; j < reqs.size(); ++j) {
      if (!got[j].ok() && got[j].status().code() == StatusCode::kNotFound) {
        // Gone from this tier since locate() (moved by an eviction or a promotion, or deleted):
        // read it where it is now, once; only a block that is nowhere is a miss.
        if (const int now = c_.relocate(reqs[j].hash, static_cast<int>(t)); now >= 0) {
          got[j] = tiers[now]->read(reqs[j]);
          if (got[j].ok()) c_.metrics_.relocated.inc();
        } else {
          failed_[idx[j]] = 1;
          c_.gone(reqs[j].hash, t);
          continue;
        }
      }
      if (got[j].ok()) {
        blocks_[idx[j]] = std::move(got[j]).value();
      } else {
        failed_[idx[j]] = 1;
        c_.metrics_.read_failures[t].inc();
        c_.read_failure_log_.warn("block {} was in the {} tier at lookup and could not be read: {}",
                                  reqs[j].hash.hex(), tiers[t]->name(), got[j].status().to_string());
      }
    }
  }
}

size_t TieredCache::PrefixFetch::slice_end(size_t a, size_t lower) const {
  size_t b = a, n = 0;
  while (b < where_.size() && (where_[b] == 0 || n < lower)) n += where_[b++] > 0;
  return b;
}

size_t TieredCache::PrefixFetch::check_slice(size_t a, size_t b) {
  for (size_t i = a; i < b; ++i) {
    const int t = where_[i];
    // A failed read (corrupt on SSD, or evicted from the top tier since tier_holding) ends the
    // prefix here; the caller recomputes the rest.
    if (failed_[i]) return i;
    const bool same = blocks_[i] ? BlockRequest{keys_[i].hash, keys_[i].tokens}.tokens_match(
                                       blocks_[i]->identity().token_ids)
                                 : top_presence_[i] == Tier::Presence::kSameTokens;
    if (!same) {
      c_.metrics_.token_mismatches[t].inc();
      c_.mismatch_log_.error("not serving block {} from {}: its token ids differ from the request's",
                             keys_[i].hash.hex(), c_.tiers_[t]->name());
      return i;
    }
  }
  return b;
}

void TieredCache::PrefixFetch::promote_slice(size_t a, size_t end, std::vector<PinnedBlocks::Entry>& out) {
  // The copy below stays (inclusive tiers), so losing the race for room costs only the pin.
  std::vector<BlockRef> promote;
  for (size_t i = a; i < end; ++i) {
    if (where_[i] > 0) promote.push_back(blocks_[i]);
  }
  std::vector<Result<InsertOutcome>> promoted = top_.insert_many(promote);
  size_t p = 0;
  std::array<uint64_t, kMaxTiers> fetched{};  // counted once per tier, not an atomic add per block
  for (size_t i = a; i < end; ++i) {
    const int t = where_[i];
    PinnedBlocks::Entry e{keys_[i].hash, blocks_[i], t, top_pinned_[i], -1};
    if (t > 0) {
      const bool ok = promoted[p++].ok();
      if (ok) c_.metrics_.promotions.inc();
      e.pinned = ok && top_.pin(keys_[i].hash);
      if (!e.pinned) c_.metrics_.promote_failed.inc();
    }
    if (t == 0) {
      e.device_slot = top_slot_[i];
    } else if (e.pinned) {
      if (auto slot = top_.device_slot(keys_[i].hash)) e.device_slot = *slot;
    }
    ++fetched[t];
    c_.cascade_.used(keys_[i].hash);
    out.push_back(std::move(e));
  }
  for (size_t t = 0; t < fetched.size(); ++t) {
    if (fetched[t] > 0) c_.metrics_.fetched_blocks[t].inc(fetched[t]);
  }
}

void TieredCache::PrefixFetch::read_and_promote(std::vector<PinnedBlocks::Entry>& out) {
  size_slices();
  size_t slice_blocks = first_slice_;
  size_t a = 0, b = slice_end(0, slice_blocks);
  read_slice(a, b);
  // Later slices hold about slice_bytes_, sized from a block the first one read.
  for (size_t i = a; i < b && slice_blocks == first_slice_; ++i) {
    if (where_[i] > 0 && blocks_[i]) {
      slice_blocks = std::max<size_t>(first_slice_, slice_bytes_ / std::max<uint64_t>(1, blocks_[i]->size_bytes()));
    }
  }
  // Small blocks: at most kMaxIoSliceBlocks a slice, so that uploads overlap reads there too (a
  // 16 KiB-block prefix of 512 blocks was one 64 MiB slice after the first: read whole, 7 ms on
  // the H100 host, then uploaded whole, 2 ms more).
  constexpr size_t kMaxIoSliceBlocks = 128;
  if (any_io_) slice_blocks = std::min(slice_blocks, std::max(first_slice_, kMaxIoSliceBlocks));
  // Up to kLookahead slices are being read while one is promoted, so the disk always has a
  // slice's worth of reads queued, also while the last reads of the one before finish.
  constexpr size_t kLookahead = 2;
  struct Ahead {
    size_t a, b;
    WorkerPool::Task read;  // not valid when the slice was read on this thread
  };
  std::deque<Ahead> ahead;
  size_t next_a = b;
  auto read_ahead = [&] {
    while (ahead.size() < kLookahead && next_a < where_.size()) {
      const size_t sa = next_a, sb = slice_end(next_a, slice_blocks);
      next_a = sb;
      WorkerPool::Task t;
      if (any_io_) {
        t = WorkerPool::shared().submit([this, sa, sb] { read_slice(sa, sb); });
      } else {
        read_slice(sa, sb);  // from memory: read it here
      }
      ahead.push_back({sa, sb, std::move(t)});
    }
  };
  while (a < where_.size()) {
    read_ahead();
    const size_t good = check_slice(a, b);
    promote_slice(a, good, out);
    if (good < b || ahead.empty()) break;
    ahead.front().read.join();
    a = ahead.front().a;
    b = ahead.front().b;
    ahead.pop_front();
  }
  for (Ahead& s : ahead) s.read.join();  // read past a broken prefix: dropped
}

void TieredCache::PrefixFetch::unpin_from(size_t end) {
  std::vector<BlockHash> unneeded;
  std::vector<int32_t> slots;
  for (size_t i = end; i < where_.size(); ++i) {
    if (!top_pinned_[i]) continue;
    unneeded.push_back(keys_[i].hash);
    slots.push_back(top_slot_[i]);
  }
  if (!unneeded.empty()) top_.unpin_pinned(unneeded, slots);
}

PinnedBlocks TieredCache::fetch_located(std::span<const BlockKey> keys, std::vector<int> where,
                                        FetchTiming timing) {
  // Begun before the first read: a block erased while this fetch carries it up is refused above.
  const EraseFence::Move move = fence_->begin_move();
  metrics_.fetches.inc();
  const auto started = std::chrono::steady_clock::now();
  PinnedBlocks out;
  out.entries_.reserve(where.size());
  out.top_ = tiers_.front();
  PrefixFetch fetch(*this, keys, std::move(where));
  fetch.pin_top();
  fetch.read_and_promote(out.entries_);
  fetch.unpin_from(out.entries_.size());
  if (timing == FetchTiming::kTimed) charge_restore(out, started);
  return out;
}

void TieredCache::charge_restore(const PinnedBlocks& fetched, std::chrono::steady_clock::time_point started) {
  // All of it charged to the slowest tier it read from (a fetch's tiers overlap, and the slowest
  // one sets its pace).
  uint64_t moved = 0;
  int slowest = 0;
  for (const PinnedBlocks::Entry& e : fetched.entries_) {
    if (e.source_tier == 0 || !e.block) continue;
    moved += e.block->size_bytes();
    slowest = std::max(slowest, e.source_tier);
  }
  if (moved > 0) costs_.observe_restore(static_cast<size_t>(slowest), moved, seconds_since(started));
}

}  // namespace kvtier
