#include "base/hashing/keyed_hash.h"

#include <bit>
#include <cstring>
#include <random>

namespace kvtier {

void draw_random_words(std::span<uint64_t> out) {
  std::random_device seed;
  for (uint64_t& w : out) w = (static_cast<uint64_t>(seed()) << 32) ^ seed();
}

SipKey SipKey::draw() {
  uint64_t w[2];
  draw_random_words(w);
  return {w[0], w[1]};
}

namespace {

struct SipState {
  uint64_t v0, v1, v2, v3;
  void round() {
    v0 += v1;
    v1 = std::rotl(v1, 13);
    v1 ^= v0;
    v0 = std::rotl(v0, 32);
    v2 += v3;
    v3 = std::rotl(v3, 16);
    v3 ^= v2;
    v0 += v3;
    v3 = std::rotl(v3, 21);
    v3 ^= v0;
    v2 += v1;
    v1 = std::rotl(v1, 17);
    v1 ^= v2;
    v2 = std::rotl(v2, 32);
  }
  void compress(uint64_t m, int c) {
    v3 ^= m;
    for (int i = 0; i < c; ++i) round();
    v0 ^= m;
  }
};

}  // namespace

uint64_t siphash(std::span<const uint8_t> bytes, const SipKey& key, int c, int d) {
  SipState s{key.k0 ^ 0x736f6d6570736575ull, key.k1 ^ 0x646f72616e646f6dull,
             key.k0 ^ 0x6c7967656e657261ull, key.k1 ^ 0x7465646279746573ull};
  const size_t whole = bytes.size() / 8 * 8;
  for (size_t i = 0; i < whole; i += 8) {
    uint64_t m;
    std::memcpy(&m, bytes.data() + i, 8);  // little-endian words, as the specification reads them
    s.compress(m, c);
  }
  // The last block: the remaining bytes, and the length's low byte on top.
  uint64_t last = static_cast<uint64_t>(bytes.size()) << 56;
  for (size_t i = whole; i < bytes.size(); ++i)
    last |= static_cast<uint64_t>(bytes[i]) << (8 * (i - whole));
  s.compress(last, c);
  s.v2 ^= 0xff;
  for (int i = 0; i < d; ++i) s.round();
  return s.v0 ^ s.v1 ^ s.v2 ^ s.v3;
}

}  // namespace kvtier
