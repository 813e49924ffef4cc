// AVX2 build of xxh3-64 (compiled with -mavx2 in its own file; call only where the CPU has AVX2).
// `state` is Checksum64's opaque, 64-byte aligned storage of an XXH3_state_t.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvtier::detail {

uint64_t xxh3_64_avx2(const void* data, size_t len);
void xxh3_reset_avx2(void* state);
void xxh3_update_avx2(void* state, const void* data, size_t len);
uint64_t xxh3_digest_avx2(const void* state);

}  // namespace kvtier::detail
