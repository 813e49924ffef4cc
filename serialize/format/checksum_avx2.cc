// Compiled with -mavx2 (see serialize/CMakeLists.txt). XXH_INLINE_ALL gives this file a private,
// static copy of xxh3 whose vector code is AVX2; nothing here is called unless the CPU has AVX2.
#define XXH_INLINE_ALL
#define XXH_VECTOR XXH_AVX2
#include <xxhash.h>

#include "serialize/format/checksum_avx2.h"

namespace kvtier::detail {

uint64_t xxh3_64_avx2(const void* data, size_t len) { return XXH3_64bits(data, len); }

void xxh3_reset_avx2(void* state) {
  auto* s = static_cast<XXH3_state_t*>(state);
  XXH3_INITSTATE(s);
  XXH3_64bits_reset(s);
}

void xxh3_update_avx2(void* state, const void* data, size_t len) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state), data, len);
}

uint64_t xxh3_digest_avx2(const void* state) {
  return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state));
}

}  // namespace kvtier::detail
