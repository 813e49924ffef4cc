// BlockEventSink: hears each block that enters or leaves one holder of blocks — a tier's index,
// the GPU block pool — so that someone outside (a prefix-aware router, through the KV events of
// cache/events/) can keep the set each holder has. Holders call it under their own lock, at the
// moment their contents change: one holder's calls about one hash arrive in the order its
// contents changed, and replaying them gives exactly the set it holds.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "serialize/block.h"
#include "serialize/block_hash.h"

namespace kvtier {

// What a holder knows of a block when it takes it in. A tier that keeps only an index (the SSD
// after a restart, a block moved out of a reclaimed segment) knows no tokens and no parent.
struct StoredBlock {
  const BlockHash& hash;
  const BlockHash* parent = nullptr;    // null when not known
  std::span<const uint32_t> token_ids;  // empty when not known
  uint32_t block_tokens = 0;            // how many tokens the block holds
  std::string_view namespace_id;
};

// A block whose identity is known in full.
inline StoredBlock stored_block(const BlockIdentity& id) {
  return StoredBlock{id.hash, &id.parent_hash, id.token_ids,
                     static_cast<uint32_t>(id.token_ids.size()), id.namespace_id};
}

// Implementations must be thread-safe, must not block (they are called under tier locks on the
// data path) and must not call back into the holder.
class BlockEventSink {
 public:
  virtual ~BlockEventSink() = default;
  virtual void stored(const StoredBlock& block) = 0;
  virtual void removed(const BlockHash& hash) = 0;
};

}  // namespace kvtier
