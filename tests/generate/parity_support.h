// What the parity tests share (parity_test.cc: the tiny Llama; hybrid_parity_test.cc: the tiny
// hybrid): deterministic prompts, and a comparison of generations token by token and logit by
// logit as bytes.
#pragma once

#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "generate/cached_generator.h"

namespace kvtier::testing {

inline std::vector<int32_t> tokens_from(int seed, int n) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back((seed * 97 + i * 53 + (i * i) % 13) % 512);
  return t;
}

// Tokens equal and every logit the same 32 bits.
inline void expect_bit_identical(const Generation& got, const Generation& want, const std::string& what) {
  EXPECT_EQ(got.tokens, want.tokens) << what;
  ASSERT_EQ(got.logits.size(), want.logits.size()) << what;
  for (size_t s = 0; s < got.logits.size(); ++s) {
    ASSERT_EQ(got.logits[s].size(), want.logits[s].size()) << what;
    EXPECT_EQ(std::memcmp(got.logits[s].data(), want.logits[s].data(), got.logits[s].size() * 4), 0)
        << what << ": logits of step " << s << " differ";
  }
}

}  // namespace kvtier::testing
