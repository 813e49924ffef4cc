#include "engine/reference/reference_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace kvtier::reference {

void paged_attention(const PagedKvHost& c, const AttentionOptions& o, std::span<const float> q,
                     int num_heads, std::span<const int32_t> block_tables, int max_blocks_per_seq,
                     std::span<const int32_t> seq_lens, std::span<const int32_t> cu,
                     std::span<float> out) {
  const int d = c.head_dim;
  const int gqa = num_heads / c.num_kv_heads;
  auto element = [&](const uint8_t* cache, int seq, int pos, int kh, int i) {
    const int block = block_tables[seq * max_blocks_per_seq + pos / c.block_size];
    const size_t idx =
        ((static_cast<size_t>(block) * c.block_size + pos % c.block_size) * c.num_kv_heads + kh) * d + i;
    return load_kv_element(c.dtype, cache, idx);
  };
  std::vector<float> scores;
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    const int q_len = cu[s + 1] - cu[s];
    const int ctx = seq_lens[s];
    for (int r = 0; r < q_len; ++r) {
      const int pos = ctx - q_len + r;
      const int lo = o.window > 0 ? std::max(pos - o.window + 1, 0) : 0;
      for (int h = 0; h < num_heads; ++h) {
        const int kh = h / gqa;
        const float* qrow = &q[(static_cast<size_t>(cu[s] + r) * num_heads + h) * d];
        scores.assign(pos - lo + 1, 0.0f);
        float m = -std::numeric_limits<float>::infinity();
        for (int t = lo; t <= pos; ++t) {
          float dot = 0;
          for (int i = 0; i < d; ++i) dot += qrow[i] * element(c.k, static_cast<int>(s), t, kh, i);
          float sc = dot * o.scale;
          if (o.softcap > 0) sc = o.softcap * std::tanh(sc / o.softcap);
          scores[t - lo] = sc;
          m = std::max(m, sc);
        }
        float l = 0;
        for (float& sc : scores) {
          sc = std::exp(sc - m);
          l += sc;
        }
        float* orow = &out[(static_cast<size_t>(cu[s] + r) * num_heads + h) * d];
        for (int i = 0; i < d; ++i) {
          float acc = 0;
          for (int t = lo; t <= pos; ++t) acc += scores[t - lo] * element(c.v, static_cast<int>(s), t, kh, i);
          orow[i] = acc / l;
        }
      }
    }
  }
}

}  // namespace kvtier::reference
