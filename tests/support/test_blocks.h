// Real blocks for tests and benchmarks: random values of every dtype (optionally salted with the
// values serializers get wrong: NaN payloads, +-inf, +-0, subnormals) and KV-like data (a few
// sinusoids plus noise per channel, as real keys and values look to a compressor).
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>

#include "serialize/block.h"
#include "serialize/kv_layout.h"

namespace kvtier::testing {

enum class Values {
  kRandom,         // uniform in [-4, 4)
  kWithSpecials,   // random, with every special bit pattern mixed in
  kKvLike,         // smooth per-channel signal plus noise
};

std::shared_ptr<const KvLayout> share(KvLayout layout);
// An identity whose tokens, hash and parent hash are derived from `seed` (not a real prefix hash:
// serialize/ must not depend on cache/).
BlockIdentity identity_for(const KvLayout& layout, uint64_t seed);
Block make_block(std::shared_ptr<const KvLayout> layout, uint64_t seed, Values values = Values::kRandom);
// Fills one dense tensor of dtype `dtype` with `values`.
void fill_tensor(DType dtype, std::span<uint8_t> bytes, std::mt19937_64& rng, Values values,
                 int head_dim);
bool same_bytes(const Block& a, const Block& b);

}  // namespace kvtier::testing
