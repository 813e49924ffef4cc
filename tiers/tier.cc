#include "tiers/tier.h"

namespace kvtier {

std::vector<Result<BlockRef>> Tier::read_many(std::span<const BlockRequest> requests) {
  std::vector<Result<BlockRef>> out;
  out.reserve(requests.size());
  for (const BlockRequest& r : requests) out.push_back(read(r));
  return out;
}

std::vector<bool> Tier::contains_many(std::span<const BlockHash> hashes) const {
  std::vector<bool> out;
  out.reserve(hashes.size());
  for (const BlockHash& h : hashes) out.push_back(contains(h));
  return out;
}

std::vector<Result<InsertOutcome>> Tier::insert_many(std::span<const BlockRef> blocks) {
  std::vector<Result<InsertOutcome>> out;
  out.reserve(blocks.size());
  for (const BlockRef& b : blocks) out.push_back(insert(b));
  return out;
}

std::vector<Tier::PinResult> Tier::pin_many(std::span<const BlockRequest> requests) {
  std::vector<PinResult> out(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    if (!pin(requests[i].hash)) continue;
    out[i].pinned = true;
    out[i].slot = device_slot(requests[i].hash);
    if (out[i].slot) out[i].presence = probe(requests[i]);
  }
  return out;
}

void Tier::unpin_many(std::span<const BlockHash> hashes) {
  for (const BlockHash& h : hashes) unpin(h);
}

void Tier::unpin_pinned(std::span<const BlockHash> hashes, std::span<const int32_t>) {
  unpin_many(hashes);
}

void Tier::set_eviction_sink(EvictionSink sink) {
  std::lock_guard lock(sink_mu_);
  sink_ = std::move(sink);
}

bool Tier::refuse_erased(const BlockHash& hash) const {
  if (!fence_ || !fence_->blocks(hash)) return false;
  fence_->refused.inc();
  return true;
}

void Tier::evict_to_sink(std::vector<BlockRef>& victims) {
  EvictionSink sink;
  {
    std::lock_guard lock(sink_mu_);
    sink = sink_;
  }
  for (BlockRef& b : victims) {
    if (sink) sink(std::move(b));
  }
  victims.clear();
}

}  // namespace kvtier
