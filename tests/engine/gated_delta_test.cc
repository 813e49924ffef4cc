// The Gated DeltaNet CPU references against each other (issue 35's first step): the chunked form
// a GPU kernel will follow equals the token-by-token recurrence, and a sequence split anywhere,
// its state carried across, equals the sequence in one piece — the property a prefix cache that
// snapshots the state at a block boundary rests on.
//
// Tolerance: both forms compute in f32 the same sums in other orders. With |k| = 1, beta in (0, 1)
// and decays <= 1, every state entry and output stays within a few times max|v| (here 1), and each
// is a sum of at most d_k + chunk products of such values: reassociation moves it by tens of ulps
// of 1 (measured: outputs <= 4e-8 apart, states <= 4e-7, over the lengths below), so 1e-5 absolute
// (~84 ulps) bounds it with room, while an error in the algebra moves outputs by 1e-2 or more (the
// doubled decay of the control test: 1.8e-2).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "engine/reference/reference_gated_delta.h"

namespace kvtier {
namespace {

using reference::GatedDeltaInputs;
using reference::GatedDeltaShape;

struct Sequence {
  GatedDeltaShape shape;
  int tokens;
  std::vector<float> q, k, v, g, beta;

  Sequence(GatedDeltaShape s, int t, uint32_t seed) : shape(s), tokens(t) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f), unit(0.0f, 1.0f);
    auto rows = [&](std::vector<float>& x, int width, bool normalise) {
      x.resize(size_t(t) * s.heads * width);
      for (float& e : x) e = uni(rng);
      if (!normalise) return;
      for (size_t r = 0; r < x.size(); r += width) {
        float n = 0.0f;
        for (int i = 0; i < width; ++i) n += x[r + i] * x[r + i];
        for (int i = 0; i < width; ++i) x[r + i] /= std::sqrt(n);
      }
    };
    rows(q, s.d_k, true);
    rows(k, s.d_k, true);
    rows(v, s.d_v, false);
    g.resize(size_t(t) * s.heads);
    beta.resize(g.size());
    for (float& e : g) e = std::log(0.80f + 0.2f * unit(rng));  // decays in [0.8, 1]
    for (float& e : beta) e = 0.05f + 0.9f * unit(rng);
  }

  GatedDeltaInputs inputs(int first = 0, int count = -1) const {
    const int n = count < 0 ? tokens - first : count;
    const size_t H = shape.heads;
    GatedDeltaInputs in;
    in.q = std::span(q).subspan(first * H * shape.d_k, n * H * shape.d_k);
    in.k = std::span(k).subspan(first * H * shape.d_k, n * H * shape.d_k);
    in.v = std::span(v).subspan(first * H * shape.d_v, n * H * shape.d_v);
    in.g = std::span(g).subspan(first * H, n * H);
    in.beta = std::span(beta).subspan(first * H, n * H);
    in.tokens = n;
    in.scale = 1.0f / std::sqrt(float(shape.d_k));
    return in;
  }
  size_t state_size() const { return size_t(shape.heads) * shape.d_k * shape.d_v; }
  size_t out_size() const { return size_t(tokens) * shape.heads * shape.d_v; }
};

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0.0f;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

std::vector<float> random_state(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-0.5f, 0.5f);
  std::vector<float> s(n);
  for (float& e : s) e = uni(rng);
  return s;
}

class GatedDeltaChunksTest : public ::testing::TestWithParam<int> {};

TEST_P(GatedDeltaChunksTest, ChunkedEqualsTheRecurrenceInOutputsAndFinalState) {
  const int tokens = GetParam();
  const Sequence seq({2, 64, 32}, tokens, 100 + tokens);
  for (bool fresh : {true, false}) {
    const std::vector<float> start = fresh ? std::vector<float>(seq.state_size()) : random_state(seq.state_size(), 7);
    std::vector<float> s_rec = start, s_chunk = start;
    std::vector<float> o_rec(seq.out_size()), o_chunk(seq.out_size());
    reference::gated_delta_recurrent(seq.shape, seq.inputs(), s_rec, o_rec);
    reference::gated_delta_chunked(seq.shape, seq.inputs(), 64, s_chunk, o_chunk);
    EXPECT_LT(max_abs_diff(o_rec, o_chunk), 1e-5f) << "tokens " << tokens << (fresh ? " fresh" : " from a state");
    EXPECT_LT(max_abs_diff(s_rec, s_chunk), 1e-5f) << "tokens " << tokens << (fresh ? " fresh" : " from a state");
  }
}

INSTANTIATE_TEST_SUITE_P(Lengths, GatedDeltaChunksTest, ::testing::Values(1, 17, 63, 64, 65, 200));

TEST(GatedDeltaTest, TheTestsToleranceCatchesAWrongDecay) {
  // The control for the tolerance above: the chunked form with every decay applied once too often
  // (g doubled) is far outside it, so the equality is not an accident of a loose bound.
  Sequence seq({2, 64, 32}, 100, 5);
  std::vector<float> s_rec(seq.state_size()), s_bad(seq.state_size());
  std::vector<float> o_rec(seq.out_size()), o_bad(seq.out_size());
  reference::gated_delta_recurrent(seq.shape, seq.inputs(), s_rec, o_rec);
  for (float& e : seq.g) e *= 2.0f;
  reference::gated_delta_chunked(seq.shape, seq.inputs(), 64, s_bad, o_bad);
  EXPECT_GT(max_abs_diff(o_rec, o_bad), 1e-2f);
}

TEST(GatedDeltaTest, ASequenceSplitAtABlockBoundaryWithItsStateCarriedEqualsItInOnePiece) {
  const Sequence seq({2, 64, 32}, 160, 11);
  std::vector<float> s_whole(seq.state_size()), o_whole(seq.out_size());
  reference::gated_delta_recurrent(seq.shape, seq.inputs(), s_whole, o_whole);
  // The recurrence is sequential: split at block 6 (token 96), it gives the same bits.
  std::vector<float> s_split(seq.state_size()), o_split(seq.out_size());
  const size_t first_out = size_t(96) * seq.shape.heads * seq.shape.d_v;
  reference::gated_delta_recurrent(seq.shape, seq.inputs(0, 96), s_split, std::span(o_split).first(first_out));
  reference::gated_delta_recurrent(seq.shape, seq.inputs(96), s_split, std::span(o_split).subspan(first_out));
  EXPECT_EQ(s_split, s_whole);
  EXPECT_EQ(o_split, o_whole);
  // Chunked, split at a chunk boundary: the same within the tolerance.
  std::vector<float> s_chunks(seq.state_size()), o_chunks(seq.out_size());
  reference::gated_delta_chunked(seq.shape, seq.inputs(0, 96), 32, s_chunks, std::span(o_chunks).first(first_out));
  reference::gated_delta_chunked(seq.shape, seq.inputs(96), 32, s_chunks, std::span(o_chunks).subspan(first_out));
  EXPECT_LT(max_abs_diff(s_chunks, s_whole), 1e-5f);
  EXPECT_LT(max_abs_diff(o_chunks, o_whole), 1e-5f);
}

TEST(GatedDeltaTest, FullWriteWithNoMemoryLeavesExactlyTheOuterProduct) {
  // beta = 1 and a decay of 0 (g = -inf) forget everything and write k^T v: S = k^T v exactly.
  Sequence seq({1, 8, 8}, 1, 3);
  seq.g[0] = -INFINITY;
  seq.beta[0] = 1.0f;
  std::vector<float> state = random_state(seq.state_size(), 9), out(seq.out_size());
  reference::gated_delta_recurrent(seq.shape, seq.inputs(), state, out);
  for (int i = 0; i < 8; ++i) {
    for (int j = 0; j < 8; ++j) EXPECT_FLOAT_EQ(state[i * 8 + j], seq.k[i] * seq.v[j]) << i << "," << j;
  }
}

TEST(CausalConv1dTest, StreamingInPiecesEqualsOneShotAndTheDirectFormula) {
  const int tokens = 23, channels = 5, width = 4;
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  std::vector<float> x(tokens * channels), w(channels * width), bias(channels);
  for (float& e : x) e = uni(rng);
  for (float& e : w) e = uni(rng);
  for (float& e : bias) e = uni(rng);
  std::vector<float> window(channels * (width - 1), 0.0f), y(tokens * channels);
  reference::causal_conv1d_silu(x, tokens, channels, w, width, bias, window, y);
  for (int t = 0; t < tokens; ++t) {
    for (int c = 0; c < channels; ++c) {
      float s = bias[c];
      for (int tap = 0; tap < width; ++tap) {
        const int at = t - (width - 1 - tap);
        if (at >= 0) s += w[c * width + tap] * x[at * channels + c];
      }
      EXPECT_FLOAT_EQ(y[t * channels + c], s / (1.0f + std::exp(-s))) << t << "," << c;
    }
  }
  // In pieces of 1, 2 and the rest, the window carried: the same bits, and the same final window.
  std::vector<float> window2(channels * (width - 1), 0.0f), y2(tokens * channels);
  int at = 0;
  for (int n : {1, 2, tokens - 3}) {
    reference::causal_conv1d_silu(std::span(x).subspan(at * channels, n * channels), n, channels, w, width, bias,
                                  window2, std::span(y2).subspan(at * channels, n * channels));
    at += n;
  }
  EXPECT_EQ(y2, y);
  EXPECT_EQ(window2, window);
  for (int c = 0; c < channels; ++c) {
    for (int p = 0; p < width - 1; ++p) EXPECT_EQ(window[c * (width - 1) + p], x[(tokens - (width - 1) + p) * channels + c]);
  }
}

}  // namespace
}  // namespace kvtier
