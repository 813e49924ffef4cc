#include "engine/reference/reference_cache_ops.h"

#include <cstring>

namespace kvtier::reference {

void reshape_and_cache(std::span<const uint8_t> key, std::span<const uint8_t> value, DType in_dtype,
                       std::span<const int32_t> slot_mapping, int num_kv_heads, int head_dim,
                       std::span<uint8_t> k_cache, std::span<uint8_t> v_cache, DType cache_dtype) {
  const size_t per_token = static_cast<size_t>(num_kv_heads) * head_dim;
  const size_t in_esz = dtype_size(in_dtype), out_esz = dtype_size(cache_dtype);
  for (size_t t = 0; t < slot_mapping.size(); ++t) {
    if (slot_mapping[t] < 0) continue;
    const size_t dst = static_cast<size_t>(slot_mapping[t]) * per_token;
    for (auto [src, cache] : {std::pair{key, k_cache}, std::pair{value, v_cache}}) {
      for (size_t i = 0; i < per_token; ++i) {
        if (in_dtype == cache_dtype) {
          std::memcpy(&cache[(dst + i) * out_esz], &src[(t * per_token + i) * in_esz], out_esz);
        } else {
          store_kv_element(cache_dtype, cache.data(), dst + i,
                           load_kv_element(in_dtype, src.data(), t * per_token + i));
        }
      }
    }
  }
}

std::vector<uint8_t> gather_blocks(std::span<const LayerArrays> layers, std::span<const int32_t> ids) {
  std::vector<uint8_t> out;
  for (int32_t id : ids) {
    for (const LayerArrays& l : layers) {
      for (std::span<uint8_t> a : {l.k, l.v}) {
        const uint8_t* src = a.data() + static_cast<size_t>(id) * l.block_bytes;
        out.insert(out.end(), src, src + l.block_bytes);
      }
    }
  }
  return out;
}

void scatter_blocks(std::span<const uint8_t> staging, std::span<const LayerArrays> layers,
                    std::span<const int32_t> ids) {
  size_t off = 0;
  for (int32_t id : ids) {
    for (const LayerArrays& l : layers) {
      for (std::span<uint8_t> a : {l.k, l.v}) {
        std::memcpy(a.data() + static_cast<size_t>(id) * l.block_bytes, staging.data() + off, l.block_bytes);
        off += l.block_bytes;
      }
    }
  }
}

}  // namespace kvtier::reference
