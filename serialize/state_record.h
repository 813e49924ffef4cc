// State records: how a hybrid model's snapshot (every Gated DeltaNet layer's f32 state and conv
// window at the end of one block) travels through the tiers — as a Block of its own
// layout, so the RAM, SSD and remote tiers, the block codec, checksums and recovery carry it
// unchanged. The snapshot layout has one "layer" per GDN layer, F32, one head, the KV block's
// block_size; layer j's K then V hold GDN layer j's state then window as one f32 vector (zero
// padding at the end, to the head_dim multiple of 8 the layout needs). A record's identity: hash
// = the snapshot key of the KV block it ends at, parent = that block's hash (chain-aware eviction
// then treats it as that block's child: it goes before the block), tokens = that block's tokens
// (checked on every hit), extra keys = a tag, the hybrid layout's fingerprint and the prefix
// length ("tokens=N"), then the KV block's.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/memory/aligned_buffer.h"
#include "base/status.h"
#include "serialize/block.h"
#include "serialize/hybrid_layout.h"

namespace kvtier {

// The first extra key of every state record; the second is "hybrid=" + the hybrid fingerprint,
// the third "tokens=" + the length of the prefix the snapshot summarises.
inline constexpr const char* kStateRecordTag = "kvtier.state.v1";

// The layout state records of `hybrid` are stored in (one per hybrid layout; register it where
// records are decoded). Its name is the hybrid's name + ".state".
KvLayout snapshot_layout(const HybridLayout& hybrid);

// Whether `block` is a state record (its extra keys start with the tag).
bool is_state_record(const Block& block);

// The record of `snapshot` (hybrid.snapshot_bytes(): per GDN layer the state then the window,
// f32) for the KV block `kv` identifies: `key` is that block's snapshot key. `layout` must be
// snapshot_layout(hybrid). invalid_argument for a snapshot of another size.
Result<Block> make_state_record(const HybridLayout& hybrid, std::shared_ptr<const KvLayout> layout,
                                const BlockIdentity& kv, const BlockHash& key, uint64_t prefix_tokens,
                                std::span<const uint8_t> snapshot);

// The snapshot a record holds (hybrid.snapshot_bytes()). kCorruption when the record is not one of
// `hybrid`'s (layout, tag, or non-zero padding: bytes that no snapshot wrote).
Result<AlignedBuffer> snapshot_of(const HybridLayout& hybrid, const Block& record);
// The length of the prefix a record's snapshot summarises; kCorruption when it does not say.
Result<uint64_t> prefix_tokens_of(const Block& record);
// The KV block's extra keys (a record's after its own three).
std::vector<std::string> block_extra_keys_of(const Block& record);

}  // namespace kvtier
