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
#include <string>
#include <string_view>
#include <vector>

#include "serialize/block_hash.h"

namespace kvtier {

enum class KvMedium : uint8_t { kGpu, kCpu, kSsd, kRemote };
inline constexpr size_t kKvMediums = 4;
std::string_view medium_name(KvMedium m);

struct KvEvent {
  enum class Kind : uint8_t { kStored, kRemoved, kAllCleared };
  Kind kind = Kind::kStored;
  KvMedium medium = KvMedium::kCpu;
  bool has_parent = false;
  BlockHash hash;
  BlockHash parent;
  uint32_t block_tokens = 0;
  std::vector<uint32_t> token_ids;
  std::string namespace_id;
};

// One EventBatch, msgpack-encoded.
std::string encode_event_batch(double unix_seconds, const KvEvent* events, size_t count);

}  // namespace kvtier
