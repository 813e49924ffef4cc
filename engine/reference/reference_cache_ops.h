// CPU references for the data-movement kernels: reshape_and_cache and gather/scatter of blocks.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "serialize/dtype.h"

namespace kvtier::reference {

// key/value [num_tokens, num_kv_heads, head_dim] in in_dtype; cache arrays in cache_dtype;
// same-dtype copies keep the bits, f32 -> 16-bit rounds to nearest even.
void reshape_and_cache(std::span<const uint8_t> key, std::span<const uint8_t> value, DType in_dtype,
                       std::span<const int32_t> slot_mapping, int num_kv_heads, int head_dim,
                       std::span<uint8_t> k_cache, std::span<uint8_t> v_cache, DType cache_dtype);

// One layer of a model's cache, as gather/scatter see it.
struct LayerArrays {
  std::span<uint8_t> k, v;
  uint64_t block_bytes;  // bytes of one block in one of the arrays
};
// Packs blocks `ids` of every layer (K then V, layer by layer) into one buffer, block after block.
std::vector<uint8_t> gather_blocks(std::span<const LayerArrays> layers, std::span<const int32_t> ids);
void scatter_blocks(std::span<const uint8_t> staging, std::span<const LayerArrays> layers,
                    std::span<const int32_t> ids);

}  // namespace kvtier::reference
