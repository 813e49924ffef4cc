// KvEvent and its wire form: the events prefix-aware routers (llm-d's KV-cache indexer, NVIDIA
// Dynamo's KV router) read from vLLM engines, so that they can read them from kvtier too. The
// layout is vLLM's (vllm/distributed/kv_events.py), as msgspec encodes its structs with
// array_like=True and omit_defaults=True: each struct is a msgpack array of its fields in order,
// trailing fields at their default left out, and a tagged union's member opens with its class name.
//
//   EventBatch       [ts: float64 (Unix seconds), events: array]     (data_parallel_rank omitted)
//   BlockStored      ["BlockStored", block_hashes: [bin], parent_block_hash: bin | nil,
//                     token_ids: [uint], block_size: uint, lora_id: nil, medium: str,
//                     lora_name: str | nil]                           (extra_keys, group_idx...
//                     omitted)
//   BlockRemoved     ["BlockRemoved", block_hashes: [bin], medium: str]
//   AllBlocksCleared ["AllBlocksCleared"]
//
// kvtier's mapping: one event per block; a hash is kvtier's 32-byte BlockHash as bin (the key its
// HTTP API names in hex); the parent is the block's chain parent (for a prompt's first block, its
// namespace's root); block_size is the block's token count; lora_name carries the namespace (the
// model/layout fingerprint and tenant, where vLLM puts its LoRA and cache-salt identity); medium
// is the tier: "GPU", "CPU" (RAM), "SSD", "REMOTE". A block announced from an index alone (the SSD
// after a restart) has a nil parent and no token ids.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "serialize/block_hash.h"

namespace kvtier {

enum class KvMedium : uint8_t { kGpu, kCpu, kSsd, kRemote };
inline constexpr size_t kKvMediums = 4;
std::string_view medium_name(KvMedium m);

// One event. Its token ids and namespace live in the KvEventBuffer that holds it.
struct KvEvent {
  enum class Kind : uint8_t { kStored, kRemoved, kAllCleared };
  Kind kind = Kind::kStored;
  KvMedium medium = KvMedium::kCpu;
  bool has_parent = false;
  BlockHash hash;
  BlockHash parent;
  uint32_t block_tokens = 0;
  uint32_t tokens_begin = 0;  // into the buffer's token ids
  uint32_t tokens_count = 0;
  int32_t namespace_index = -1;  // into the buffer's namespaces; -1: none
};

// Events with their token ids and namespaces kept flat beside them, so that once its vectors have
// grown a reused buffer appends without allocating: appends run under the tiers' locks, and a
// per-event allocation there (freed later on the publisher's thread) is what this avoids.
class KvEventBuffer {
 public:
  void append(KvEvent e, std::span<const uint32_t> tokens = {}, std::string_view ns = {});
  // Empties it, keeping every vector's and namespace string's capacity.
  void clear();
  void swap(KvEventBuffer& other) noexcept;

  size_t size() const { return events_.size(); }
  bool empty() const { return events_.empty(); }
  const KvEvent& operator[](size_t i) const { return events_[i]; }
  std::span<const uint32_t> tokens(const KvEvent& e) const {
    return {tokens_.data() + e.tokens_begin, e.tokens_count};
  }
  std::string_view namespace_of(const KvEvent& e) const {
    return e.namespace_index < 0 ? std::string_view() : namespaces_[e.namespace_index];
  }

 private:
  // Tries the namespaces used lately before taking a new slot: a burst of events mostly shares
  // one or a few.
  int32_t namespace_slot(std::string_view ns);

  std::vector<KvEvent> events_;
  std::vector<uint32_t> tokens_;
  std::vector<std::string> namespaces_;  // the first namespaces_used_ are in use
  size_t namespaces_used_ = 0;
};

// The wire's 8-byte big-endian integers (a batch's sequence number, a replay's start) and
// msgpack's float 64 body.
std::string big_endian(uint64_t v);
uint64_t from_big_endian(std::string_view b);

// Events [first, first + count) of `events` as one EventBatch, msgpack-encoded.
std::string encode_event_batch(double unix_seconds, const KvEventBuffer& events, size_t first,
                               size_t count);

}  // namespace kvtier
