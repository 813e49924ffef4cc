#include "tests/support/test_blocks.h"

#include <cmath>
#include <cstring>

namespace kvtier::testing {

std::shared_ptr<const KvLayout> share(KvLayout layout) {
  return std::make_shared<const KvLayout>(std::move(layout));
}

BlockIdentity identity_for(const KvLayout& layout, uint64_t seed) {
  std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull + 1);
  BlockIdentity id;
  for (auto& b : id.hash.bytes) b = static_cast<uint8_t>(rng());
  for (auto& b : id.parent_hash.bytes) b = static_cast<uint8_t>(rng());
  for (int i = 0; i < layout.block_size; ++i) id.token_ids.push_back(static_cast<uint32_t>(rng() % 152064));
  id.namespace_id = "test-model";
  return id;
}

namespace {

// Bit patterns that break naive serializers, per 16-bit dtype and for f32.
const uint16_t kSpecial16F16[] = {0x7c00, 0xfc00, 0x0000, 0x8000, 0x0001, 0x8001, 0x03ff,
                                  0x7e01, 0x7d55, 0xfe3f, 0x7bff, 0x0400};
const uint16_t kSpecial16BF16[] = {0x7f80, 0xff80, 0x0000, 0x8000, 0x0001, 0x8001, 0x007f,
                                   0x7fc1, 0x7f81, 0xffa5, 0x7f7f, 0x0080};
const uint32_t kSpecial32[] = {0x7f800000, 0xff800000, 0x00000000, 0x80000000, 0x00000001,
                               0x807fffff, 0x7fc00001, 0x7f800001, 0xffbadbad, 0x7f7fffff};

}  // namespace

void fill_tensor(DType dtype, std::span<uint8_t> bytes, std::mt19937_64& rng, Values values,
                 int head_dim) {
  const size_t esz = dtype_size(dtype);
  const size_t n = bytes.size() / esz;
  std::uniform_real_distribution<float> uni(-4.0f, 4.0f);
  std::normal_distribution<float> noise(0.0f, 0.05f);
  // Per-channel sinusoid parameters for KV-like data.
  std::vector<float> amp(head_dim), freq(head_dim), phase(head_dim), offset(head_dim);
  if (values == Values::kKvLike) {
    for (int c = 0; c < head_dim; ++c) {
      amp[c] = 0.2f + 1.5f * std::abs(uni(rng)) / 4.0f;
      freq[c] = 0.01f + 0.3f * std::abs(uni(rng)) / 4.0f;
      phase[c] = uni(rng);
      offset[c] = uni(rng) / 8.0f;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    float v;
    if (values == Values::kKvLike) {
      const size_t c = i % head_dim;
      const float t = static_cast<float>(i / head_dim);
      v = offset[c] + amp[c] * std::sin(freq[c] * t + phase[c]) +
          0.5f * amp[c] * std::sin(2.7f * freq[c] * t) + noise(rng);
    } else {
      v = uni(rng);
    }
    store_kv_element(dtype, bytes.data(), i, v);
    if (values == Values::kWithSpecials && rng() % 5 == 0) {
      if (esz == 2) {
        const uint16_t* table = dtype == DType::kF16 ? kSpecial16F16 : kSpecial16BF16;
        uint16_t bits = table[rng() % 12];
        std::memcpy(bytes.data() + 2 * i, &bits, 2);
      } else {
        uint32_t bits = kSpecial32[rng() % 10];
        std::memcpy(bytes.data() + 4 * i, &bits, 4);
      }
    }
  }
}

Block make_block(std::shared_ptr<const KvLayout> layout, uint64_t seed, Values values) {
  Block b = Block::dense(layout, identity_for(*layout, seed));
  std::mt19937_64 rng(seed);
  for (int l = 0; l < layout->num_layers; ++l) {
    for (KvPart p : {KvPart::kK, KvPart::kV}) {
      fill_tensor(layout->layers[l].dtype, b.dense_part(l, p), rng, values, layout->head_dim);
    }
  }
  return b;
}

bool same_bytes(const Block& a, const Block& b) {
  return a.data().size() == b.data().size() &&
         std::memcmp(a.data().data(), b.data().data(), a.data().size()) == 0;
}

}  // namespace kvtier::testing
