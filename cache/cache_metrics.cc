#include "cache/cache_metrics.h"

namespace kvtier {

void CacheMetrics::visit(MetricVisitor& v, std::span<const std::string> tier_names) const {
  v.counter("kvtier_relocated_reads_total",
            "Blocks read from another tier than lookup found them in (they moved meanwhile)", {}, relocated.value());
  auto tier_label = [&](size_t t) { return MetricLabels{{"tier", tier_names[t]}}; };
  v.counter("kvtier_lookups_total", "Prefix lookups", {}, lookups.value());
  v.counter(
      "kvtier_lookups_stopped_at_top_total",
      "Lookups that asked the top tier alone: the caller's hit plan could only compute the rest",
      {}, lookups_stopped_at_top.value());
  v.counter("kvtier_lookup_tokens_total", "Tokens asked about in lookups", {},
            lookup_tokens.value());
  for (size_t t = 0; t < tier_names.size(); ++t) {
    v.counter("kvtier_lookup_hit_blocks_total", "Blocks found by lookups, by tier", tier_label(t),
              hit_blocks[t].value());
    v.counter("kvtier_lookup_hit_tokens_total", "Tokens found by lookups, by tier", tier_label(t),
              hit_tokens[t].value());
    v.counter("kvtier_fetched_blocks_total", "Blocks fetched, by the tier they came from",
              tier_label(t), fetched_blocks[t].value());
    v.counter("kvtier_token_mismatches_total", "Hits whose token ids differed (never served)",
              tier_label(t), token_mismatches[t].value());
    v.counter("kvtier_read_failures_total", "Blocks a tier held but could not return (corrupt, or an I/O error)",
              tier_label(t), read_failures[t].value());
    v.counter("kvtier_gone_since_lookup_total",
              "Blocks found in a tier by a lookup and in no tier when read (deleted or evicted meanwhile): misses",
              tier_label(t), gone_since_lookup[t].value());
    v.counter("kvtier_evictions_total", "Blocks evicted from the tier (down or dropped)",
              tier_label(t), evictions[t].value());
  }
  v.counter("kvtier_inserts_total", "Blocks published", {}, inserts.value());
  v.counter("kvtier_duplicate_inserts_total", "Publishes of blocks already held", {},
            duplicate_inserts.value());
  v.counter("kvtier_collisions_total", "Publishes rejected: same hash, different tokens", {},
            collisions.value());
  v.counter("kvtier_fetches_total", "Fetch requests", {}, fetches.value());
  v.counter("kvtier_background_fetches_total",
            "Asynchronous fetches whose blocks were loaded off the caller's thread (from SSD or remote)",
            {}, background_fetches.value());
  v.gauge("kvtier_background_fetches_in_flight", "Asynchronous fetches still loading", {},
          static_cast<double>(background_fetches_in_flight.value()));
  v.counter("kvtier_promotions_total", "Blocks copied up into the top tier", {},
            promotions.value());
  v.counter("kvtier_promote_failed_total", "Fetched blocks the top tier had no room for", {},
            promote_failed.value());
  v.counter("kvtier_dropped_blocks_total", "Blocks dropped", {{"reason", "evicted_from_last_tier"}},
            dropped_evicted_from_last_tier.value());
  v.counter("kvtier_dropped_blocks_total", "Blocks dropped", {{"reason", "lower_tier_refused"}},
            dropped_lower_tier_refused.value());
  v.counter("kvtier_dropped_blocks_total", "Blocks dropped", {{"reason", "no_room"}},
            dropped_no_room.value());
  v.counter("kvtier_dropped_blocks_total", "Blocks dropped", {{"reason", "not_admitted"}},
            dropped_not_admitted.value());
  v.counter("kvtier_dropped_blocks_total", "Blocks dropped", {{"reason", "erased_in_flight"}},
            dropped_erased_in_flight.value());
}

}  // namespace kvtier
