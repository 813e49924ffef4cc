// base/hashing/keyed_hash against the SipHash paper's published outputs, and keys drawn anew.
#include "base/hashing/keyed_hash.h"

#include <array>
#include <numeric>

#include <gtest/gtest.h>

namespace kvtier {
namespace {

// The paper's key (bytes 00..0f, read as two little-endian words) and its outputs for SipHash-2-4:
// the empty message, and the 15-byte message 00..0e of its worked example. siphash13 is the same
// code with other round counts, so these hold its compression, padding and finalization.
TEST(KeyedHashTest, SipHash24GivesThePapersOutputs) {
  const SipKey key{0x0706050403020100ull, 0x0f0e0d0c0b0a0908ull};
  EXPECT_EQ(siphash24({}, key), 0x726fdb47dd0e0e31ull);
  std::array<uint8_t, 15> message;
  std::iota(message.begin(), message.end(), uint8_t{0});
  EXPECT_EQ(siphash24(message, key), 0xa129ca6149be45e5ull);
  EXPECT_NE(siphash13(message, key), siphash24(message, key));
}

TEST(KeyedHashTest, DrawnKeysDiffer) {
  const SipKey a = SipKey::draw(), b = SipKey::draw();
  EXPECT_FALSE(a.k0 == b.k0 && a.k1 == b.k1);
  const std::array<uint8_t, 4> x{1, 2, 3, 4};
  EXPECT_NE(siphash13(x, a), siphash13(x, b));
}

}  // namespace
}  // namespace kvtier
