#include "cache/tiered_cache.h"

#include <algorithm>
#include <cassert>
#include <deque>

#include "base/threads/worker_pool.h"
#include "cache/fetch_loader.h"

namespace kvtier {

PinnedBlocks::~PinnedBlocks() { release(); }

PinnedBlocks& PinnedBlocks::operator=(PinnedBlocks&& o) noexcept {
  if (this != &o) {
    release();
    top_ = std::move(o.top_);
    entries_ = std::move(o.entries_);
  }
  return *this;
}

void PinnedBlocks::release() {
  if (top_) {
    std::vector<BlockHash> pinned;
    pinned.reserve(entries_.size());
    for (const Entry& e : entries_) {
      if (e.pinned) pinned.push_back(e.hash);
    }
    top_->unpin_many(pinned);
  }
  entries_.clear();
  top_.reset();
}

TieredCache::TieredCache(std::vector<std::shared_ptr<Tier>> tiers) : tiers_(std::move(tiers)) {
  assert(!tiers_.empty() && tiers_.size() <= kMaxTiers);
  for (size_t i = 0; i < tiers_.size(); ++i) {
    tiers_[i]->set_eviction_sink([this, i](BlockRef b) { on_evicted(i, std::move(b)); });
  }
}

TieredCache::~TieredCache() {
  loader_.reset();  // loads in flight finish first: they use the tiers
  for (auto& t : tiers_) t->set_eviction_sink(nullptr);
}

bool PendingFetch::ready() const {
  return now_.has_value() || (later_.valid() && later_.wait_for(std::chrono::seconds(0)) == std::future_status::ready);
}

bool PendingFetch::wait_until(std::chrono::steady_clock::time_point deadline) const {
  return now_.has_value() || (later_.valid() && later_.wait_until(deadline) == std::future_status::ready);
}

PinnedBlocks PendingFetch::wait() {
  if (now_) {
    PinnedBlocks out = std::move(*now_);
    now_.reset();
    return out;
  }
  return later_.valid() ? later_.get() : PinnedBlocks();
}

namespace {
// A fetch's keys with their own copy of the tokens, for a load that outlives the caller's buffers.
struct OwnedKeys {
  std::vector<uint32_t> tokens;
  std::vector<BlockKey> keys;
  explicit OwnedKeys(std::span<const BlockKey> from) {
    size_t n = 0;
    for (const BlockKey& k : from) n += k.tokens.size();
    tokens.reserve(n);
    for (const BlockKey& k : from) tokens.insert(tokens.end(), k.tokens.begin(), k.tokens.end());
    size_t at = 0;
    for (const BlockKey& k : from) {
      keys.push_back({k.hash, std::span<const uint32_t>(tokens.data() + at, k.tokens.size())});
      at += k.tokens.size();
    }
  }
};
constexpr size_t kLoaderThreads = 2;
}  // namespace

PendingFetch TieredCache::fetch_async(std::span<const BlockKey> keys, bool always_background, bool timed) {
  PendingFetch out;
  const std::vector<int> where = locate(keys);
  const bool waits = std::any_of(where.begin(), where.end(), [&](int t) { return tiers_[t]->reads_wait_on_io(); });
  if (!waits && !always_background) {
    out.now_ = fetch_located(keys, where, timed);
    return out;
  }
  {
    std::lock_guard lock(loader_mu_);
    if (!loader_) loader_ = std::make_unique<FetchLoader>(kLoaderThreads);
  }
  auto owned = std::make_shared<OwnedKeys>(keys);
  auto promise = std::make_shared<std::promise<PinnedBlocks>>();
  out.later_ = promise->get_future();
  metrics_.background_fetches.inc();
  metrics_.background_fetches_in_flight.add(1);
  auto job = [this, owned, promise, timed] {
    PinnedBlocks got = fetch_located(owned->keys, locate(owned->keys), timed);
    metrics_.background_fetches_in_flight.add(-1);
    promise->set_value(std::move(got));
  };
  if (!loader_->submit(job)) job();
  return out;
}

void TieredCache::on_evicted(size_t from, BlockRef block) {
  metrics_.evictions[from].inc();
  // The next local tier down takes it; one that cannot (a block larger than it, everything
  // pinned) passes it further down rather than losing it.
  bool kept = false, lower_local = false;
  Status last;
  for (size_t t = from + 1; t < tiers_.size() && !kept; ++t) {
    if (tiers_[t]->remote() || !tiers_[t]->accepts(block->layout())) continue;
    lower_local = true;
    if (t == admission_tier_ && !admission_->admit(block->hash())) {
      last = failed_precondition("not admitted by " + std::string(admission_->name()));
      continue;
    }
    auto r = tiers_[t]->insert(block);
    kept = r.ok();
    if (!kept) last = r.status();
  }
  // Shared tiers get it write-behind whatever the local ones did (they count their own drops).
  const bool shared = offer_to_shared(block, from + 1);
  if (kept) return;
  if (!shared) tell_dropped(block);
  if (!lower_local) {
    if (!shared) metrics_.dropped_evicted_from_last_tier.inc();  // the normal end of a block's life
    return;
  }
  if (shared) return;
  if (last.code() == StatusCode::kFailedPrecondition && admission_) {
    metrics_.dropped_not_admitted.inc();  // the admission rule's job: counted, logged once a while
    if (auto n = admission_log_.admit()) {
      spdlog::info("block {} evicted from {} not written to {}: {} ({} similar since)", block->hash().hex(),
                   tiers_[from]->name(), tiers_[admission_tier_]->name(), last.message(), *n);
    }
    return;
  }
  metrics_.dropped_lower_tier_refused.inc();
  if (auto n = drop_log_.admit()) {
    spdlog::warn("dropped block {} evicted from {}: {} ({} similar suppressed)", block->hash().hex(),
                 tiers_[from]->name(), last.to_string(), *n);
  }
}

bool TieredCache::offer_to_shared(const BlockRef& block, size_t first_tier) {
  bool taken = false;
  for (size_t t = first_tier; t < tiers_.size(); ++t) {
    if (tiers_[t]->remote()) taken = tiers_[t]->insert(block).ok() || taken;
  }
  return taken;
}

int TieredCache::find_tier(const BlockRequest& request) const {
  for (size_t t = 0; t < tiers_.size(); ++t) {
    if (!tiers_[t]->remote() && tiers_[t]->contains(request.hash)) return static_cast<int>(t);
  }
  return -1;
}

std::vector<int> TieredCache::locate(std::span<const BlockKey> keys) const {
  std::vector<int> where;
  // The local tiers are asked a window of keys at a time (one index MultiGet on the SSD for the
  // window, not a Get per block: a 512-block prefix took ~1.1 ms to locate on the H100 host that
  // way). Windows start at 4 and double up to 256, so a prompt that misses early costs a few
  // lookups, and those past the first miss are at most 3 or the prefix found before it.
  size_t i = 0;
  for (size_t window = 4; i < keys.size(); window = std::min<size_t>(window * 2, 256)) {
    const size_t end = std::min(keys.size(), i + window);
    std::vector<int> found(end - i, -1);
    for (size_t t = 0; t < tiers_.size(); ++t) {
      if (tiers_[t]->remote()) continue;
      std::vector<BlockHash> ask;
      std::vector<size_t> at;
      for (size_t j = i; j < end; ++j) {
        if (found[j - i] < 0) {
          ask.push_back(keys[j].hash);
          at.push_back(j - i);
        }
      }
      if (ask.empty()) break;
      const std::vector<bool> has = tiers_[t]->contains_many(ask);
      for (size_t k = 0; k < ask.size(); ++k) {
        if (has[k]) found[at[k]] = static_cast<int>(t);
      }
    }
    size_t j = i;
    for (; j < end && found[j - i] >= 0; ++j) where.push_back(found[j - i]);
    i = j;
    if (j < end) break;
  }
  bool any_shared = false;
  for (const auto& t : tiers_) any_shared = any_shared || t->remote();
  if (i == keys.size() || !any_shared) return where;
  // The rest of the chain from the shared tiers, one batch each; a local copy still wins.
  std::vector<BlockHash> rest;
  for (size_t j = i; j < keys.size(); ++j) rest.push_back(keys[j].hash);
  std::vector<int> shared(rest.size(), -1);
  for (size_t t = 0; t < tiers_.size(); ++t) {
    if (!tiers_[t]->remote()) continue;
    const std::vector<bool> has = tiers_[t]->contains_many(rest);
    for (size_t j = 0; j < rest.size(); ++j) {
      if (has[j] && shared[j] < 0) shared[j] = static_cast<int>(t);
    }
  }
  for (size_t j = 0; j < rest.size(); ++j) {
    int t = j == 0 ? -1 : find_tier({keys[i + j].hash, keys[i + j].tokens});
    if (t < 0) t = shared[j];
    if (t < 0) break;
    where.push_back(t);
  }
  return where;
}

LookupResult TieredCache::lookup(const PrefixHasher& hasher, std::span<const uint32_t> tokens,
                                 std::span<const std::string> extra_keys) {
  std::vector<BlockKey> keys = hasher.keys(tokens, extra_keys);
  metrics_.lookup_tokens.inc(tokens.size());
  return lookup(keys);
}

LookupResult TieredCache::lookup(std::span<const BlockKey> keys) {
  metrics_.lookups.inc();
  LookupResult out;
  const std::vector<int> where = locate(keys);
  for (size_t i = 0; i < where.size(); ++i) {
    const int t = where[i];
    out.blocks.push_back({keys[i].hash, t});
    out.matched_tokens += keys[i].tokens.size();
    metrics_.hit_blocks[t].inc();
    metrics_.hit_tokens[t].inc(keys[i].tokens.size());
  }
  return out;
}

void TieredCache::set_admission(size_t tier, std::unique_ptr<AdmissionPolicy> policy) {
  admission_tier_ = tier;
  admission_ = std::move(policy);
}

Tier::Presence TieredCache::presence(const BlockRequest& request) const {
  for (const auto& t : tiers_) {
    if (t->remote()) continue;
    const Tier::Presence p = t->probe(request);
    if (p != Tier::Presence::kAbsent) return p;
  }
  return Tier::Presence::kAbsent;
}

Result<InsertOutcome> TieredCache::insert(BlockRef block) {
  if (admission_) admission_->used(block->hash());
  const BlockRequest req{block->hash(), block->identity().token_ids};
  for (size_t t = 0; t < tiers_.size(); ++t) {
    if (tiers_[t]->remote() || !tiers_[t]->accepts(block->layout())) continue;  // never a round trip per block
    const Tier::Presence p = tiers_[t]->probe(req);
    if (p == Tier::Presence::kDifferentTokens) {
      metrics_.collisions.inc();
      if (auto n = collision_log_.admit()) {
        spdlog::error("rejected block {}: {} tier holds different tokens under this hash "
                      "(collision or forged hash; {} similar suppressed)",
                      block->hash().hex(), tiers_[t]->name(), *n);
      }
      return conflict("block " + block->hash().hex() +
                      ": a block with different token ids is stored under this hash");
    }
    if (p != Tier::Presence::kAbsent) {
      metrics_.duplicate_inserts.inc();
      return InsertOutcome::kAlreadyPresent;
    }
  }
  Status last;
  // Shared tiers get a copy write-behind, so other hosts see the block as soon as it is written.
  offer_to_shared(block, 0);
  for (size_t t = 0; t < tiers_.size(); ++t) {
    if (tiers_[t]->remote() || !tiers_[t]->accepts(block->layout())) continue;
    auto r = tiers_[t]->insert(block);
    if (r.ok()) {
      if (*r == InsertOutcome::kInserted) metrics_.inserts.inc();
      else metrics_.duplicate_inserts.inc();
      return r;
    }
    // A namespace at its quota is refused, not diverted to a lower tier: the tenant decides what
    // to free (the refusal is counted by the tier and answered as such).
    if (r.status().code() == StatusCode::kNoSpace) return r.status();
    last = r.status();
  }
  metrics_.dropped_no_room.inc();
  if (auto n = drop_log_.admit()) {
    spdlog::warn("dropped new block {}: no tier could take it: {} ({} similar suppressed)",
                 block->hash().hex(), last.to_string(), *n);
  }
  return last;
}

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

std::vector<TieredCache::LoadEstimate> TieredCache::estimate_load(const LookupResult& found,
                                                                   uint64_t block_bytes) const {
  std::vector<size_t> blocks(tiers_.size(), 0);
  for (const LookupResult::Hit& h : found.blocks) ++blocks[h.tier];
  const HitCostModel::Snapshot costs = costs_.snapshot();  // once: every lookup of kvtierd asks
  std::vector<LoadEstimate> out;
  for (size_t t = 1; t < tiers_.size(); ++t) {
    if (blocks[t] == 0) continue;
    out.push_back({std::string(tiers_[t]->name()), blocks[t], costs.restore_seconds(t, blocks[t] * block_bytes)});
  }
  return out;
}

void TieredCache::gone(const BlockHash& hash, size_t tier) {
  metrics_.gone_since_lookup[tier].inc();
  if (auto n = read_failure_log_.admit()) {
    spdlog::info("block {} left the {} tier between lookup and read and is in no tier now (deleted, or evicted "
                 "from the last one): a miss ({} similar suppressed)",
                 hash.hex(), tiers_[tier]->name(), *n);
  }
}

size_t TieredCache::add_drop_listener(DropListener listener) {
  std::lock_guard lock(drop_listeners_mu_);
  drop_listeners_.emplace(next_drop_listener_, std::move(listener));
  return next_drop_listener_++;
}

void TieredCache::remove_drop_listener(size_t id) {
  std::lock_guard lock(drop_listeners_mu_);
  drop_listeners_.erase(id);
}

void TieredCache::tell_dropped(const BlockRef& block) {
  std::lock_guard lock(drop_listeners_mu_);
  for (const auto& [id, listener] : drop_listeners_) listener(block);
}

Result<BlockRef> TieredCache::read_record(const BlockRequest& request) {
  for (size_t t = 0; t < tiers_.size(); ++t) {
    // A shared tier is read at once (a miss is a counted not-found: one round trip, not two).
    if (!tiers_[t]->remote() && !tiers_[t]->contains(request.hash)) continue;
    auto r = tiers_[t]->read(request);
    if (!r.ok()) {
      if (r.status().code() != StatusCode::kNotFound) metrics_.read_failures[t].inc();
      continue;  // gone meanwhile or failed its checks (counted by the tier): try below
    }
    if (!request.tokens_match((*r)->identity().token_ids)) {
      metrics_.token_mismatches[t].inc();
      if (auto n = mismatch_log_.admit()) {
        spdlog::error("record {} in the {} tier holds other tokens than the request's: not served ({} similar "
                      "suppressed)", request.hash.hex(), tiers_[t]->name(), *n);
      }
      continue;
    }
    metrics_.fetched_blocks[t].inc();
    for (size_t up = 0; up < t; ++up) {
      if (tiers_[up]->remote() || !tiers_[up]->accepts((*r)->layout())) continue;
      if (tiers_[up]->insert(*r).ok()) metrics_.promotions.inc();
      break;  // the highest that accepts it; one that has no room leaves it where it was
    }
    return r;
  }
  return not_found("record " + request.hash.hex() + " is in no tier");
}

bool TieredCache::erase(const BlockHash& hash) {
  bool any = false;
  for (auto& t : tiers_) any = t->erase(hash) || any;
  return any;
}

}  // namespace kvtier
