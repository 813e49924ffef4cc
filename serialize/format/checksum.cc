#include "serialize/format/checksum.h"

#include <cstring>

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "serialize/format/checksum_avx2.h"

namespace kvtier {

static_assert(sizeof(XXH3_state_t) <= Checksum64::kStateSize, "xxh3 state grew");
static_assert(alignof(XXH3_state_t) <= 64, "xxh3 state alignment grew");

namespace {

bool have_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
}

// Small enough to stay in L1d between the copy and the hash.
constexpr size_t kChunk = 16 << 10;

}  // namespace

uint64_t checksum64(const void* data, size_t len) {
  if (have_avx2()) return detail::xxh3_64_avx2(data, len);
  return XXH3_64bits(data, len);
}

Checksum64::Checksum64() {
  if (have_avx2()) {
    detail::xxh3_reset_avx2(state_);
  } else {
    auto* s = reinterpret_cast<XXH3_state_t*>(state_);
    XXH3_INITSTATE(s);
    XXH3_64bits_reset(s);
  }
}

void Checksum64::update(const void* data, size_t len) {
  if (have_avx2()) {
    detail::xxh3_update_avx2(state_, data, len);
  } else {
    XXH3_64bits_update(reinterpret_cast<XXH3_state_t*>(state_), data, len);
  }
}

void Checksum64::copy_update(void* dst, const void* src, size_t len) {
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  for (size_t off = 0; off < len; off += kChunk) {
    const size_t n = len - off < kChunk ? len - off : kChunk;
    std::memcpy(d + off, s + off, n);
    update(d + off, n);
  }
}

uint64_t Checksum64::digest() const {
  if (have_avx2()) return detail::xxh3_digest_avx2(state_);
  return XXH3_64bits_digest(reinterpret_cast<const XXH3_state_t*>(state_));
}

const char* checksum64_implementation() { return have_avx2() ? "avx2" : "sse2"; }

}  // namespace kvtier
