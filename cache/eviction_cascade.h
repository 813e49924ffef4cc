// EvictionCascade: where a block evicted from one tier goes. The next local tier down that
// accepts its layout takes it (the SSD only if its admission rule admits it); one that cannot (a
// block larger than it, everything pinned) passes it further down rather than losing it. Shared
// (remote) tiers get it write-behind whatever the local ones did. A block erased on its way down
// goes no further. What no tier keeps is dropped — counted by reason, logged (throttled) unless it
// is the normal end of a block's life — and the drop listeners are told. Thread-safe: it runs on
// whichever thread evicts.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "base/log.h"
#include "cache/cache_metrics.h"
#include "tiers/erase_fence.h"
#include "tiers/policy/admission_policy.h"
#include "tiers/tier.h"

namespace kvtier {

class EvictionCascade {
 public:
  // `tiers`, `metrics` and `fence` outlive this.
  EvictionCascade(const std::vector<std::shared_ptr<Tier>>& tiers, CacheMetrics& metrics, const EraseFence& fence)
      : tiers_(tiers), metrics_(metrics), fence_(fence) {}

  // Blocks leaving the tier above `tier` reach it only if `policy` admits them. Before any
  // eviction.
  void set_admission(size_t tier, std::unique_ptr<AdmissionPolicy> policy);
  // Tells the admission rule a block was used (stored or read), so it can learn what comes back.
  void used(const BlockHash& hash) {
    if (admission_) admission_->used(hash);
  }

  // `block` left tier `from`.
  void on_evicted(size_t from, BlockRef block);
  // Queues `block` for every shared tier at or below `first_tier`; true if one took it.
  bool offer_to_shared(const BlockRef& block, size_t first_tier);

  using DropListener = std::function<void(const BlockRef&)>;
  size_t add_drop_listener(DropListener listener);
  // Waits for its calls in flight.
  void remove_drop_listener(size_t id);

 private:
  void tell_dropped(const BlockRef& block);

  const std::vector<std::shared_ptr<Tier>>& tiers_;
  CacheMetrics& metrics_;
  const EraseFence& fence_;
  std::unique_ptr<AdmissionPolicy> admission_;
  size_t admission_tier_ = SIZE_MAX;
  LogThrottle admission_log_;
  LogThrottle drop_log_;
  std::mutex listeners_mu_;  // held while they run: removal waits for them
  std::map<size_t, DropListener> listeners_;
  size_t next_listener_ = 0;
};

}  // namespace kvtier
