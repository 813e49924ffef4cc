// Byte shuffle (as in Blosc/HDF5): regroups the bytes of `width`-byte elements so that all first
// bytes come first, then all second bytes, ... For bf16/f16 KV this puts the slowly varying
// sign/exponent bytes together, which LZ4 can then compress; on raw KV it finds almost nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace kvtier {

// dst.size() must equal src.size(); trailing bytes (size % width) are copied unchanged.
void byte_shuffle(std::span<const uint8_t> src, std::span<uint8_t> dst, size_t width);
void byte_unshuffle(std::span<const uint8_t> src, std::span<uint8_t> dst, size_t width);

}  // namespace kvtier
