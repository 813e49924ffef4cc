#include "cache/tiered_cache.h"

#include <algorithm>
#include <array>
#include <cassert>

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
    // The top tier's own blocks were pinned by pin_many() (given back with their slots), the ones
    // promoted into it by pin().
    std::vector<BlockHash> pinned, in_place;
    std::vector<int32_t> slots;
    in_place.reserve(entries_.size());
    slots.reserve(entries_.size());
    for (const Entry& e : entries_) {
      if (!e.pinned) continue;
      if (e.source_tier == 0) {
        in_place.push_back(e.hash);
        slots.push_back(e.device_slot);
      } else {
        pinned.push_back(e.hash);
      }
    }
    if (!in_place.empty()) top_->unpin_pinned(in_place, slots);
    if (!pinned.empty()) top_->unpin_many(pinned);
  }
  entries_.clear();
  top_.reset();
}

TieredCache::TieredCache(std::vector<std::shared_ptr<Tier>> tiers) : tiers_(std::move(tiers)) {
  assert(!tiers_.empty() && tiers_.size() <= kMaxTiers);
  for (size_t i = 0; i < tiers_.size(); ++i) {
    tiers_[i]->set_erase_fence(fence_);
    tiers_[i]->set_eviction_sink([this, i](BlockRef b) { cascade_.on_evicted(i, std::move(b)); });
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

PendingFetch TieredCache::fetch_async(std::span<const BlockKey> keys, FetchThread thread, FetchTiming timing) {
  PendingFetch out;
  const std::vector<int> where = locate(keys);
  const bool waits = std::any_of(where.begin(), where.end(), [&](int t) { return tiers_[t]->reads_wait_on_io(); });
  if (!waits && thread == FetchThread::kWhenItWaits) {
    out.now_ = fetch_located(keys, where, timing);
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
  auto job = [this, owned, promise, timing] {
    PinnedBlocks got = fetch_located(owned->keys, locate(owned->keys), timing);
    metrics_.background_fetches_in_flight.add(-1);
    promise->set_value(std::move(got));
  };
  if (!loader_->submit(job)) job();
  return out;
}

int TieredCache::tier_holding(const BlockHash& hash) const {
  for (size_t t = 0; t < tiers_.size(); ++t) {
    if (!tiers_[t]->remote() && tiers_[t]->contains(hash)) return static_cast<int>(t);
  }
  return -1;
}

std::vector<int> TieredCache::locate(std::span<const BlockKey> keys) const {
  std::vector<int> where;
  // The local tiers are asked a window of keys at a time (one index MultiGet on the SSD for the
  // window, not a Get per block: a 512-block prefix took ~1.1 ms to locate on the H100 host that
  // way). Windows start at 4 and double up to 256, so a prompt that misses early costs a few
  // lookups, and those past the first miss are at most 3 or the prefix found before it.
  where.reserve(keys.size());
  size_t i = 0;
  std::vector<int> found;
  std::vector<BlockHash> ask;
  std::vector<size_t> at;
  for (size_t window = 4; i < keys.size(); window = std::min<size_t>(window * 2, 256)) {
    const size_t end = std::min(keys.size(), i + window);
    found.assign(end - i, -1);
    for (size_t t = 0; t < tiers_.size(); ++t) {
      if (tiers_[t]->remote()) continue;
      ask.clear();
      at.clear();
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
    int t = j == 0 ? -1 : tier_holding(keys[i + j].hash);
    if (t < 0) t = shared[j];
    if (t < 0) break;
    where.push_back(t);
  }
  return where;
}

LookupResult TieredCache::lookup(const PrefixHasher& hasher, std::span<const uint32_t> tokens,
                                 std::span<const std::string> extra_keys) {
  std::vector<BlockKey> keys = hasher.keys(tokens, extra_keys);
  return lookup(keys, tokens.size());
}

LookupResult TieredCache::lookup(std::span<const BlockKey> keys,
                                 std::optional<size_t> prompt_tokens) {
  count_lookup(keys, prompt_tokens);
  return found_in(keys, locate(keys));
}

void TieredCache::count_lookup(std::span<const BlockKey> keys,
                               std::optional<size_t> prompt_tokens) {
  metrics_.lookups.inc();
  if (!prompt_tokens) {
    prompt_tokens = 0;
    for (const BlockKey& k : keys) *prompt_tokens += k.tokens.size();
  }
  metrics_.lookup_tokens.inc(*prompt_tokens);
}

LookupResult TieredCache::found_in(std::span<const BlockKey> keys, std::span<const int> where) {
  LookupResult out;
  out.blocks.reserve(where.size());
  // Counted per tier once, not per block: a GPU hit's lookup is hundreds of blocks, and an atomic
  // add each was a measurable part of it.
  std::array<uint64_t, kMaxTiers> blocks{}, tokens{};
  for (size_t i = 0; i < where.size(); ++i) {
    const int t = where[i];
    out.blocks.push_back({keys[i].hash, t});
    out.matched_tokens += keys[i].tokens.size();
    ++blocks[t];
    tokens[t] += keys[i].tokens.size();
  }
  for (size_t t = 0; t < tiers_.size(); ++t) {
    if (blocks[t] > 0) {
      metrics_.hit_blocks[t].inc(blocks[t]);
      metrics_.hit_tokens[t].inc(tokens[t]);
    }
  }
  return out;
}

TieredCache::PinnedLookup TieredCache::lookup_pinning_top(
    std::span<const BlockKey> keys, const std::function<bool(size_t on_top)>& look_below) {
  count_lookup(keys, std::nullopt);
  PinnedLookup out;
  Tier& top = *tiers_.front();
  out.on_top.top_ = tiers_.front();
  std::vector<PinnedBlocks::Entry>& pinned = out.on_top.entries_;
  pinned.reserve(keys.size());
  // Windows of 4, 8, ... 256 blocks, as locate() asks, so a prompt the top tier does not hold
  // pins (and gives back) a few blocks, not all of them.
  bool other_tokens = false;
  std::vector<BlockRequest> requests;
  for (size_t i = 0, window = 4; i < keys.size();
       i += window, window = std::min<size_t>(window * 2, 256)) {
    window = std::min(window, keys.size() - i);
    requests.clear();
    for (size_t j = i; j < i + window; ++j) requests.push_back({keys[j].hash, keys[j].tokens});
    const std::vector<Tier::PinResult> pins = top.pin_many(requests);
    size_t k = 0;
    for (; k < pins.size(); ++k) {
      const Tier::PinResult& p = pins[k];
      if (!p.pinned || (!p.slot && !p.block))
        break;  // not there, or to be read: fetch()'s business
      const bool same = p.block ? requests[k].tokens_match(p.block->identity().token_ids)
                                : p.presence == Tier::Presence::kSameTokens;
      if (!same) {
        metrics_.token_mismatches[0].inc();
        mismatch_log_.error("not serving block {} from {}: its token ids differ from the request's",
                            keys[i + k].hash.hex(), top.name());
        other_tokens = true;
        break;
      }
      pinned.push_back({keys[i + k].hash, p.block, 0, true, p.slot.value_or(-1)});
    }
    if (k == pins.size()) continue;
    std::vector<BlockHash> unneeded;
    std::vector<int32_t> slots;
    for (; k < pins.size(); ++k) {
      if (!pins[k].pinned) continue;
      unneeded.push_back(requests[k].hash);
      slots.push_back(pins[k].slot.value_or(-1));
    }
    if (!unneeded.empty()) top.unpin_pinned(unneeded, slots);
    break;
  }
  const size_t n = pinned.size();
  std::vector<int> where(n, 0);
  if (!other_tokens && n < keys.size()) {
    if (look_below && !look_below(n)) {
      out.stopped_at_top = true;
      metrics_.lookups_stopped_at_top.inc();
    } else {
      const std::vector<int> rest = locate(keys.subspan(n));
      where.insert(where.end(), rest.begin(), rest.end());
    }
  }
  out.found = found_in(keys, where);
  if (n > 0) {  // counted as fetch() counts what it pins in place
    metrics_.fetches.inc();
    metrics_.fetched_blocks[0].inc(n);
    for (const PinnedBlocks::Entry& e : pinned) cascade_.used(e.hash);
  }
  return out;
}

void TieredCache::set_admission(size_t tier, std::unique_ptr<AdmissionPolicy> policy) {
  cascade_.set_admission(tier, std::move(policy));
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
  fence_->revive(block->hash());  // written anew after an erase: live again
  cascade_.used(block->hash());
  const BlockRequest req{block->hash(), block->identity().token_ids};
  for (size_t t = 0; t < tiers_.size(); ++t) {
    if (tiers_[t]->remote() || !tiers_[t]->accepts(block->layout())) continue;  // never a round trip per block
    const Tier::Presence p = tiers_[t]->probe(req);
    if (p == Tier::Presence::kDifferentTokens) {
      metrics_.collisions.inc();
      collision_log_.error(
          "rejected block {}: {} tier holds different tokens under this hash (collision or forged "
          "hash)",
          block->hash().hex(), tiers_[t]->name());
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
  cascade_.offer_to_shared(block, 0);
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
  drop_log_.warn("dropped new block {}: no tier could take it: {}", block->hash().hex(),
                 last.to_string());
  return last;
}

Result<TieredCache::ScopedErase> TieredCache::erase_in(std::string_view ns, const BlockHash& hash) {
  std::optional<std::string> owner;
  for (const auto& tier : tiers_) {
    if (!tier->contains(hash)) continue;
    // Gone between the two calls (evicted, promoted away): the tiers below are asked too.
    if (auto block = tier->read({hash, {}}); block.ok()) {
      owner = (*block)->identity().namespace_id;
      break;
    }
  }
  if (owner && *owner != ns) return ScopedErase::kForeign;
  KVTIER_ASSIGN_OR_RETURN(const bool erased, erase(hash));
  return owner && erased ? ScopedErase::kErased : ScopedErase::kAbsent;
}

PrefixMatch TieredCache::describe(const LookupResult& found, uint64_t block_bytes) const {
  PrefixMatch out;
  out.matched_tokens = found.matched_tokens;
  std::vector<size_t> blocks(tiers_.size(), 0);
  for (const LookupResult::Hit& h : found.blocks) {
    out.blocks.push_back({h.hash, std::string(tiers_[h.tier]->name())});
    ++blocks[h.tier];
  }
  const HitCostModel::Snapshot costs = costs_.snapshot();  // once: every lookup of kvtierd asks
  for (size_t t = 1; t < tiers_.size(); ++t) {
    if (blocks[t] == 0) continue;
    out.load_estimates.push_back(
        {std::string(tiers_[t]->name()), blocks[t], costs.restore_seconds(t, blocks[t] * block_bytes)});
  }
  return out;
}

void TieredCache::gone(const BlockHash& hash, size_t tier) {
  metrics_.gone_since_lookup[tier].inc();
  read_failure_log_.info(
      "block {} left the {} tier between lookup and read and is in no tier now (deleted, or "
      "evicted "
      "from the last one): a miss",
      hash.hex(), tiers_[tier]->name());
}

size_t TieredCache::add_drop_listener(DropListener listener) { return cascade_.add_drop_listener(std::move(listener)); }

void TieredCache::remove_drop_listener(size_t id) { cascade_.remove_drop_listener(id); }

Result<BlockRef> TieredCache::read_record(const BlockRequest& request) {
  const EraseFence::Move move = fence_->begin_move();  // it may copy the record up
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
      mismatch_log_.error(
          "record {} in the {} tier holds other tokens than the request's: not served",
          request.hash.hex(), tiers_[t]->name());
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

Result<bool> TieredCache::erase(const BlockHash& hash) {
  const EraseFence::Erasure erasure = fence_->begin_erase(hash);
  bool any = false;
  Status failed;
  for (auto& t : tiers_) {
    auto r = t->erase_durably(hash);
    if (r.ok()) any = *r || any;
    else failed = r.status();
  }
  if (!failed.ok()) return failed;
  return any;
}

void TieredCache::visit_metrics(MetricVisitor& v) const {
  std::vector<std::string> tier_names;
  for (const auto& t : tiers_) tier_names.emplace_back(t->name());
  costs_.visit_metrics(v, tier_names);
  metrics_.visit(v, tier_names);
  v.counter("kvtier_erase_refused_moves_total",
            "Moves (promotions, prefetches, evictions) refused because their block was erased meanwhile", {},
            fence_->refused.value());
  v.gauge("kvtier_erase_tombstones", "Erased hashes still fenced against moves in flight", {},
          static_cast<double>(fence_->tombstones()));
  for (const auto& t : tiers_) t->visit_metrics(v);
}

}  // namespace kvtier
