// checksum64: xxh3-64, the checksum of frames and index entries. Debian's libxxhash is built for
// baseline x86-64 (SSE2); on CPUs with AVX2 an inlined AVX2 build is about twice as fast, chosen
// once at run time. Every variant computes the same xxh3-64 value (it is a format, not a choice).
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvtier {

uint64_t checksum64(const void* data, size_t len);

// Streaming xxh3-64: digest() equals checksum64 over everything passed to update/copy_update.
// Not thread-safe.
class Checksum64 {
 public:
  Checksum64();
  void update(const void* data, size_t len);
  // memcpy(dst, src, len) and update() with the bytes, chunk by chunk while they are in cache:
  // one pass over memory instead of two.
  void copy_update(void* dst, const void* src, size_t len);
  uint64_t digest() const;

  // Size and alignment of xxh3's state (checked against the library in checksum.cc).
  static constexpr size_t kStateSize = 576;

 private:
  alignas(64) unsigned char state_[kStateSize];
};

// Which implementation runs here: "avx2" or "sse2".
const char* checksum64_implementation();

}  // namespace kvtier
