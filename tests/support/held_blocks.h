// HeldBlocks: what a router following one holder's block events would believe it holds — every
// stored hash, less every removed one, in the order the holder told them. Tiers' tests compare it
// with what the tier really holds.
#pragma once

#include <mutex>
#include <set>

#include "serialize/block_events.h"

namespace kvtier::testing {

struct HeldBlocks final : BlockEventSink {
  void stored(const StoredBlock& b) override {
    std::lock_guard lock(mu);
    held.insert(b.hash);
    ++stores;
  }
  void removed(const BlockHash& h) override {
    std::lock_guard lock(mu);
    held.erase(h);
    ++removals;
  }
  std::set<BlockHash> snapshot() {
    std::lock_guard lock(mu);
    return held;
  }
  std::mutex mu;
  std::set<BlockHash> held;
  int stores = 0;
  int removals = 0;
};

}  // namespace kvtier::testing
