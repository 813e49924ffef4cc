// CacheMetrics: what TieredCache counts — lookups and hits per tier, inserts, collisions, fetches
// and promotions, evictions between tiers, and every drop with its reason.
#pragma once

#include <array>
#include <span>
#include <string>

#include "base/metrics/metrics.h"

namespace kvtier {

inline constexpr size_t kMaxTiers = 4;

struct CacheMetrics {
  Counter lookups;
  // lookup_pinning_top calls whose caller left the lower tiers unasked
  Counter lookups_stopped_at_top;
  Counter lookup_tokens;                        // tokens asked about
  std::array<Counter, kMaxTiers> hit_blocks{};  // per tier the block was found in
  std::array<Counter, kMaxTiers> hit_tokens{};
  Counter inserts;
  Counter duplicate_inserts;
  Counter collisions;  // same hash, different tokens: rejected
  Counter fetches;
  Counter background_fetches;  // fetch_async calls whose blocks were loaded off the caller's thread
  Gauge background_fetches_in_flight;
  std::array<Counter, kMaxTiers> fetched_blocks{};  // per tier the block came from
  Counter promotions;
  Counter promote_failed;                          // returned unpinned: no room in the top tier
  std::array<Counter, kMaxTiers> token_mismatches{};  // a hit whose tokens differ: never served
  std::array<Counter, kMaxTiers> read_failures{};     // a tier said it held a block but could not read it
  std::array<Counter, kMaxTiers> gone_since_lookup{};  // found there by locate(), in no tier at read
  Counter relocated;  // moved between locate() and read, and read where it went
  std::array<Counter, kMaxTiers> evictions{};         // handed from tier i to tier i + 1 (or dropped)
  // Drops, by reason.
  Counter dropped_evicted_from_last_tier;
  Counter dropped_lower_tier_refused;  // an evicted block the tier below would not take
  Counter dropped_no_room;             // a published block no tier could take
  Counter dropped_not_admitted;        // evicted from RAM, refused by the SSD admission rule
  Counter dropped_erased_in_flight;    // evicted, then erased before the tier below took it

  // Labels per tier with `tier_names` (top first).
  void visit(MetricVisitor& visitor, std::span<const std::string> tier_names) const;
};

}  // namespace kvtier
