#include "tiers/policy/eviction_policy.h"

#include "tiers/policy/adaptive_policy.h"
#include "tiers/policy/chain_lru_policy.h"
#include "tiers/policy/lru_policy.h"
#include "tiers/policy/s3fifo_policy.h"

namespace kvtier {

std::vector<std::string_view> eviction_policy_names() {
  return {"lru", "chain-lru", "s3fifo", "s3fifo-chain", "adaptive", "auto"};
}

std::string_view resolve_eviction_policy(std::string_view name, bool tier_below) {
  if (name != "auto") return name;
  return tier_below ? "chain-lru" : "adaptive";
}

Result<std::unique_ptr<EvictionPolicy>> make_eviction_policy(std::string_view name) {
  if (name == "lru") return std::unique_ptr<EvictionPolicy>(std::make_unique<LruPolicy>());
  if (name == "chain-lru") return std::unique_ptr<EvictionPolicy>(std::make_unique<ChainLruPolicy>());
  if (name == "s3fifo") return std::unique_ptr<EvictionPolicy>(std::make_unique<S3FifoPolicy>(false));
  if (name == "s3fifo-chain") return std::unique_ptr<EvictionPolicy>(std::make_unique<S3FifoPolicy>(true));
  // A tier on its own has nothing below it (CacheStack resolves "auto" knowing its tiers).
  if (name == "adaptive" || name == "auto")
    return std::unique_ptr<EvictionPolicy>(std::make_unique<AdaptivePolicy>());
  std::string known;
  for (auto n : eviction_policy_names()) known += (known.empty() ? "" : ", ") + std::string(n);
  return invalid_argument("unknown eviction policy '" + std::string(name) + "' (known: " + known + ")");
}

}  // namespace kvtier
