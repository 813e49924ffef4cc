// TieredCache's metrics for the exporters: its counters, every tier's, and the cost model's.
#include "cache/tiered_cache.h"

namespace kvtier {

void TieredCache::visit_metrics(MetricVisitor& v) const {
  std::vector<std::string> tier_names;
  for (const auto& t : tiers_) tier_names.emplace_back(t->name());
  costs_.visit_metrics(v, tier_names);
  v.counter("kvtier_relocated_reads_total",
            "Blocks read from another tier than lookup found them in (they moved meanwhile)", {}, metrics_.relocated.value());
  auto tier_label = [&](size_t t) { return MetricLabels{{"tier", std::string(tiers_[t]->name())}}; };
  v.counter("kvtier_lookups_total", "Prefix lookups", {}, metrics_.lookups.value());
  v.counter("kvtier_lookup_tokens_total", "Tokens asked about in lookups", {},
            metrics_.lookup_tokens.value());
  for (size_t t = 0; t < tiers_.size(); ++t) {
    v.counter("kvtier_lookup_hit_blocks_total", "Blocks found by lookups, by tier", tier_label(t),
              metrics_.hit_blocks[t].value());
    v.counter("kvtier_lookup_hit_tokens_total", "Tokens found by lookups, by tier", tier_label(t),
              metrics_.hit_tokens[t].value());
    v.counter("kvtier_fetched_blocks_total", "Blocks fetched, by the tier they came from",
              tier_label(t), metrics_.fetched_blocks[t].value());
    v.counter("kvtier_token_mismatches_total", "Hits whose token ids differed (never served)",
              tier_label(t), metrics_.token_mismatches[t].value());
    v.counter("kvtier_read_failures_total", "Blocks a tier held but could not return (corrupt, or an I/O error)",
              tier_label(t), metrics_.read_failures[t].value());
    v.counter("kvtier_gone_since_lookup_total",
              "Blocks found in a tier by a lookup and in no tier when read (deleted or evicted meanwhile): misses",
              tier_label(t), metrics_.gone_since_lookup[t].value());
    v.counter("kvtier_evictions_total", "Blocks evicted from the tier (down or dropped)",
              tier_label(t), metrics_.evictions[t].value());
  }
  v.counter("kvtier_inserts_total", "Blocks published", {}, metrics_.inserts.value());
  v.counter("kvtier_duplicate_inserts_total", "Publishes of blocks already held", {},
            metrics_.duplicate_inserts.value());
  v.counter("kvtier_collisions_total", "Publishes rejected: same hash, different tokens", {},
            metrics_.collisions.value());
  v.counter("kvtier_fetches_total", "Fetch requests", {}, metrics_.fetches.value());
  v.counter("kvtier_background_fetches_total",
            "Asynchronous fetches whose blocks were loaded off the caller's thread (from SSD or remote)",
            {}, metrics_.background_fetches.value());
  v.gauge("kvtier_background_fetches_in_flight", "Asynchronous fetches still loading", {},
          static_cast<double>(metrics_.background_fetches_in_flight.value()));
  v.counter("kvtier_promotions_total", "Blocks copied up into the top tier", {},
            metrics_.promotions.value());
  v.counter("kvtier_promote_failed_total", "Fetched blocks the top tier had no room for", {},
            metrics_.promote_failed.value());
  v.counter("kvtier_dropped_blocks_total", "Blocks dropped", {{"reason", "evicted_from_last_tier"}},
            metrics_.dropped_evicted_from_last_tier.value());
  v.counter("kvtier_dropped_blocks_total", "Blocks dropped", {{"reason", "lower_tier_refused"}},
            metrics_.dropped_lower_tier_refused.value());
  v.counter("kvtier_dropped_blocks_total", "Blocks dropped", {{"reason", "no_room"}},
            metrics_.dropped_no_room.value());
  v.counter("kvtier_dropped_blocks_total", "Blocks dropped", {{"reason", "not_admitted"}},
            metrics_.dropped_not_admitted.value());
  v.counter("kvtier_dropped_blocks_total", "Blocks dropped", {{"reason", "erased_in_flight"}},
            metrics_.dropped_erased_in_flight.value());
  v.counter("kvtier_erase_refused_moves_total",
            "Moves (promotions, prefetches, evictions) refused because their block was erased meanwhile", {},
            fence_->refused.value());
  v.gauge("kvtier_erase_tombstones", "Erased hashes still fenced against moves in flight", {},
          static_cast<double>(fence_->tombstones()));
  for (const auto& t : tiers_) t->visit_metrics(v);
}

}  // namespace kvtier
