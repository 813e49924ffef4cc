// The fixed prompts the golden tokens were generated from (tests/engine/golden_tokens.json, written
// by tools/make_golden_tokens). Changing them means regenerating the goldens with that tool.
#pragma once

#include <cstdint>
#include <vector>

namespace kvtier::testing {

inline std::vector<std::vector<int32_t>> golden_prompts() {
  std::vector<std::vector<int32_t>> prompts;
  for (int p = 0; p < 4; ++p) {
    std::vector<int32_t> t;
    const int len = 5 + 19 * p;  // 5, 24, 43, 62: inside a block, across block edges
    for (int i = 0; i < len; ++i) t.push_back((p * 131 + i * 37 + (i * i) % 11) % 512);
    prompts.push_back(t);
  }
  return prompts;
}

inline constexpr int kGoldenNewTokens = 8;

}  // namespace kvtier::testing
