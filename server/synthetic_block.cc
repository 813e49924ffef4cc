#include "server/synthetic_block.h"

#include <cstring>

namespace kvtier {

Block synthetic_block(std::shared_ptr<const KvLayout> layout, BlockIdentity id, uint64_t seed) {
  Block b = Block::dense_uninitialized(std::move(layout), std::move(id));
  std::span<uint8_t> data = b.mutable_data();
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i + 8 <= data.size(); i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    // Clearing bit 14 of every 16-bit word keeps f16 and bf16 exponents (and, through the high
    // word, f32's) below all-ones: every value is finite.
    const uint64_t v = x & 0xBFFFBFFFBFFFBFFFull;
    std::memcpy(data.data() + i, &v, 8);
  }
  return b;
}

}  // namespace kvtier
