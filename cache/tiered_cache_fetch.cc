// TieredCache's fetch path: pinning a prefix where it lies, reading what lies below, promoting it
// slice by slice into the top tier. The rest of the class is in tiered_cache.cc.
#include <algorithm>
#include <chrono>
#include <deque>

#include <spdlog/spdlog.h>

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

PinnedBlocks TieredCache::fetch_located(std::span<const BlockKey> keys, std::vector<int> where, bool timed) {
  // Begun before the first read: a block erased while this fetch carries it up is refused above.
  const EraseFence::Move move = fence_->begin_move();
  metrics_.fetches.inc();
  const auto fetch_started = std::chrono::steady_clock::now();
  PinnedBlocks out;
  out.entries_.reserve(where.size());
  out.top_ = tiers_.front();
  Tier& top = *tiers_.front();
  std::vector<BlockRef> blocks(where.size());
  // Bytes, not vector<bool>'s packed bits: a slice read on another thread sets its own entries.
  std::vector<uint8_t> failed(where.size(), 0);
  std::vector<bool> top_pinned(where.size(), false);
  // The top tier's blocks are pinned first, all in one call, so none can be evicted between the
  // check and the use; a device tier's answer carries each block's slot and token check.
  std::vector<BlockRequest> top_requests;
  std::vector<size_t> top_at;
  for (size_t i = 0; i < where.size(); ++i) {
    if (where[i] != 0) continue;
    top_requests.push_back({keys[i].hash, keys[i].tokens});
    top_at.push_back(i);
  }
  const std::vector<Tier::PinResult> top_pins = top.pin_many(top_requests);
  std::vector<Tier::Presence> top_presence(where.size(), Tier::Presence::kAbsent);
  std::vector<int32_t> top_slot(where.size(), -1);
  for (size_t k = 0; k < top_at.size(); ++k) {
    const size_t i = top_at[k];
    if (!top_pins[k].pinned) {
      // Evicted since locate(): on its way down (still readable here, unpinned) or below now.
      if (auto r = top.read({keys[i].hash, keys[i].tokens}); r.ok()) {
        blocks[i] = *r;
        metrics_.relocated.inc();
      } else if (const int now = relocate(keys[i].hash, 0); now > 0) {
        where[i] = now;
        metrics_.relocated.inc();
      } else {
        failed[i] = 1;
        gone(keys[i].hash, 0);
      }
      continue;
    }
    top_pinned[i] = true;
    if (top_pins[k].slot) {  // device tier: no copy
      top_slot[i] = *top_pins[k].slot;
      top_presence[i] = top_pins[k].presence;
      continue;
    }
    auto r = top.read({keys[i].hash, keys[i].tokens});
    if (r.ok()) blocks[i] = *r;
    else failed[i] = 1;
  }
  // Blocks from lower tiers are read and promoted slice by slice, the next slice read (on another
  // thread) while this one is checked and promoted, so a long prefix's upload to the GPU overlaps
  // the SSD's reads and nothing waits for the whole prefix to be in memory. Within a slice each
  // lower tier's blocks are read together (the SSD tier issues them as one batch). The first slice
  // is small so the first upload starts early; later ones carry about slice_bytes.
  //
  // When no block waits on I/O (RAM only) there is nothing to overlap: slices are then read on
  // this thread and 4x larger, because each one costs a submission and a wait. Measured on the
  // H100 host (e2e_bench, 256 MiB and 1 GiB Llama-3-8B prefixes from RAM, two rounds): 64 MiB
  // slices reached 0.72-0.82 of the bus, one slice for the whole prefix 0.83-0.92.
  bool any_io = false;
  for (size_t i = 0; i < where.size() && !any_io; ++i) {
    any_io = where[i] > 0 && tiers_[where[i]]->reads_wait_on_io();
  }
  // A prefix only a shared (Redis) tier holds is one slice: slices drain each node's pipeline
  // and cannot overlap (they hold the per-node connections); measured in docs/benchmarks.md.
  bool only_shared = any_io;
  for (size_t i = 0; i < where.size() && only_shared; ++i) only_shared = where[i] <= 0 || tiers_[where[i]]->remote();
  const uint64_t slice_bytes = only_shared ? UINT64_MAX : any_io ? 64ull << 20 : 256ull << 20;
  const size_t first_slice = only_shared ? where.size() : any_io ? 16 : 64;
  auto read_slice = [&](size_t a, size_t b) {
    for (size_t t = 1; t < tiers_.size(); ++t) {
      std::vector<BlockRequest> reqs;
      std::vector<size_t> idx;
      for (size_t i = a; i < b; ++i) {
        if (where[i] == static_cast<int>(t)) {
          reqs.push_back({keys[i].hash, keys[i].tokens});
          idx.push_back(i);
        }
      }
      if (reqs.empty()) continue;
      std::vector<Result<BlockRef>> got = tiers_[t]->read_many(reqs);
      for (size_t j = 0; j < reqs.size(); ++j) {
        if (!got[j].ok() && got[j].status().code() == StatusCode::kNotFound) {
          // Gone from this tier since locate() (moved by an eviction or a promotion, or deleted):
          // read it where it is now, once; only a block that is nowhere is a miss.
          if (const int now = relocate(reqs[j].hash, static_cast<int>(t)); now >= 0) {
            got[j] = tiers_[now]->read(reqs[j]);
            if (got[j].ok()) metrics_.relocated.inc();
          } else {
            failed[idx[j]] = 1;
            gone(reqs[j].hash, t);
            continue;
          }
        }
        if (got[j].ok()) {
          blocks[idx[j]] = std::move(got[j]).value();
        } else {
          failed[idx[j]] = 1;
          metrics_.read_failures[t].inc();
          if (auto n = read_failure_log_.admit()) {
            spdlog::warn("block {} was in the {} tier at lookup and could not be read: {} ({} similar suppressed)",
                         reqs[j].hash.hex(), tiers_[t]->name(), got[j].status().to_string(), *n);
          }
        }
      }
    }
  };
  // The end of the slice that starts at `a` and holds up to `lower` blocks from lower tiers.
  auto slice_end = [&](size_t a, size_t lower) {
    size_t b = a, n = 0;
    while (b < where.size() && (where[b] == 0 || n < lower)) n += where[b++] > 0;
    return b;
  };
  size_t slice_blocks = first_slice;
  size_t a = 0, b = slice_end(0, slice_blocks);
  read_slice(a, b);
  // Later slices hold about slice_bytes, sized from a block the first one read.
  for (size_t i = a; i < b && slice_blocks == first_slice; ++i) {
    if (where[i] > 0 && blocks[i]) slice_blocks = std::max<size_t>(first_slice, slice_bytes / std::max<uint64_t>(1, blocks[i]->size_bytes()));
  }
  // Small blocks: at most kMaxIoSliceBlocks a slice, so that uploads overlap reads there too (a
  // 16 KiB-block prefix of 512 blocks was one 64 MiB slice after the first: read whole, 7 ms on
  // the H100 host, then uploaded whole, 2 ms more).
  constexpr size_t kMaxIoSliceBlocks = 128;
  if (any_io) slice_blocks = std::min(slice_blocks, std::max(first_slice, kMaxIoSliceBlocks));
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
    while (ahead.size() < kLookahead && next_a < where.size()) {
      const size_t sa = next_a, sb = slice_end(next_a, slice_blocks);
      next_a = sb;
      WorkerPool::Task t;
      if (any_io) {
        t = WorkerPool::shared().submit([&, sa, sb] { read_slice(sa, sb); });
      } else {
        read_slice(sa, sb);  // from memory: read it here
      }
      ahead.push_back({sa, sb, std::move(t)});
    }
  };
  size_t good = 0;
  bool broken = false;
  while (a < where.size() && !broken) {
    read_ahead();
    // Walk this slice: check tokens, collect what must be promoted.
    for (good = a; good < b; ++good) {
      const int t = where[good];
      // A failed read (corrupt on SSD, or evicted from the top tier since find_tier) ends the
      // prefix here; the caller recomputes the rest.
      if (failed[good]) break;
      const bool same = blocks[good] ? BlockRequest{keys[good].hash, keys[good].tokens}.tokens_match(
                                           blocks[good]->identity().token_ids)
                                     : top_presence[good] == Tier::Presence::kSameTokens;
      if (!same) {
        metrics_.token_mismatches[t].inc();
        if (auto n = mismatch_log_.admit()) {
          spdlog::error("not serving block {} from {}: its token ids differ from the request's "
                        "({} similar suppressed)", keys[good].hash.hex(), tiers_[t]->name(), *n);
        }
        break;
      }
    }
    broken = good < b;
    // Promote this slice's lower-tier blocks in one call (the GPU tier uploads them together);
    // the copy below stays (inclusive tiers), so losing the race for room costs only the pin.
    std::vector<BlockRef> promote;
    for (size_t i = a; i < good; ++i) {
      if (where[i] > 0) promote.push_back(blocks[i]);
    }
    std::vector<Result<InsertOutcome>> promoted = top.insert_many(promote);
    size_t p = 0;
    for (size_t i = a; i < good; ++i) {
      const int t = where[i];
      PinnedBlocks::Entry e{keys[i].hash, blocks[i], t, top_pinned[i], -1};
      if (t > 0) {
        const bool ok = promoted[p++].ok();
        if (ok) metrics_.promotions.inc();
        e.pinned = ok && top.pin(keys[i].hash);
        if (!e.pinned) metrics_.promote_failed.inc();
      }
      if (t == 0) {
        e.device_slot = top_slot[i];
      } else if (e.pinned) {
        if (auto slot = top.device_slot(keys[i].hash)) e.device_slot = *slot;
      }
      metrics_.fetched_blocks[t].inc();
      if (admission_) admission_->used(keys[i].hash);
      out.entries_.push_back(std::move(e));
    }
    if (broken || ahead.empty()) break;
    ahead.front().read.join();
    a = ahead.front().a;
    b = ahead.front().b;
    ahead.pop_front();
  }
  for (Ahead& s : ahead) {
    s.read.join();  // read past a broken prefix: dropped
  }
  // Pins taken past the point where the prefix broke are given back.
  std::vector<BlockHash> unneeded;
  for (size_t i = good; i < where.size(); ++i) {
    if (top_pinned[i]) unneeded.push_back(keys[i].hash);
  }
  top.unpin_many(unneeded);
  // What the restore cost, for hit plans: all of it charged to the slowest tier it read from
  // (a fetch's tiers overlap, and the slowest one sets its pace).
  uint64_t moved = 0;
  int slowest = 0;
  for (const PinnedBlocks::Entry& e : out.entries_) {
    if (e.source_tier == 0 || !e.block) continue;
    moved += e.block->size_bytes();
    slowest = std::max(slowest, e.source_tier);
  }
  if (moved > 0 && timed) {
    costs_.observe_restore(static_cast<size_t>(slowest), moved,
                           std::chrono::duration<double>(std::chrono::steady_clock::now() - fetch_started).count());
  }
  return out;
}

}  // namespace kvtier
