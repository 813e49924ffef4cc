// Keyed hashing for values clients choose (block hashes arrive in PUTs): keys drawn when the
// process starts, so which values collide depends on bits no client knows. Nothing kept on disk
// may depend on these results: another process draws other keys.
#pragma once

#include <cstdint>
#include <span>

namespace kvtier {

// Random 64-bit words from the system's entropy source (std::random_device), one call for all.
void draw_random_words(std::span<uint64_t> out);

struct SipKey {
  uint64_t k0 = 0, k1 = 0;
  static SipKey draw();
};

// SipHash (Aumasson and Bernstein's keyed pseudo-random function) with `c` compression and `d`
// finalization rounds: two inputs with the same result can be found only by knowing the key,
// unlike a multiply-and-add of the input's words, whose top-bit differences cancel whatever the
// factors. siphash13 is the variant Rust's HashMap uses; siphash24 the paper's, for its test
// vectors.
uint64_t siphash(std::span<const uint8_t> bytes, const SipKey& key, int c, int d);
inline uint64_t siphash13(std::span<const uint8_t> bytes, const SipKey& key) {
  return siphash(bytes, key, 1, 3);
}
inline uint64_t siphash24(std::span<const uint8_t> bytes, const SipKey& key) {
  return siphash(bytes, key, 2, 4);
}

}  // namespace kvtier
