// gated_delta_recurrent.comp against the CPU reference (engine/reference/reference_gated_delta.h).
//
// The kernel sums in the reference's order without fused multiply-adds, so with every decay 1
// (g = 0, exp exact on both sides) it must give the reference's bits. With decays, the GPU's exp
// may differ from the C library's: Vulkan allows 3 + 2|x| ulp, here |g| <= 0.23, so ~4e-7
// relative per step; the update is a contraction (decays <= 1, beta <= 1, |k| = 1), so the
// differences do not grow along the sequence and stay near that size times the values (<= a few
// units): 1e-5 absolute bounds them with room (the CPU chunked-vs-recurrent test shows a wrong
// decay moves outputs by 1e-2).
//
// The chunk form (gated_delta_chunk_prepare.comp and gated_delta_chunk_scan.comp) is compared with
// the CPU's chunk form and with the recurrence within 1e-4 absolute: the same algebra, its sums in
// another order (the corrections as U - W S, W and U solved first), so each chunk adds rounding of
// sums of at most d_k + 16 terms of size <= 1 (~1e-5) and the contraction keeps it from growing; a
// wrong decay or coefficient moves outputs by 1e-2 or more.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <cstring>
#include <numeric>
#include <random>

#include "engine/model/gated_delta.h"
#include "engine/reference/reference_gated_delta.h"
#include "tests/engine/engine_test_env.h"

namespace kvtier {
namespace {

using testing::from_gpu;
using testing::gpu;
using testing::random_floats;
using testing::to_gpu;

struct Batch {
  uint32_t heads, d_k, d_v;
  std::vector<int32_t> lengths, cu, slots;
  std::vector<int32_t> ranges;  // per sequence: rows before its chunks, in them, after; empty: all token by token
  std::vector<float> q, k, v, g, beta, state;
  float scale;

  Batch(uint32_t h, uint32_t dk, uint32_t dv, std::vector<int32_t> lens, std::vector<int32_t> slot_of, bool decays,
        uint64_t seed)
      : heads(h), d_k(dk), d_v(dv), lengths(std::move(lens)), slots(std::move(slot_of)) {
    cu.push_back(0);
    for (int32_t n : lengths) cu.push_back(cu.back() + n);
    const size_t tokens = cu.back();
    q = unit_rows(tokens * h, dk, seed);
    k = unit_rows(tokens * h, dk, seed + 1);
    v = random_floats(tokens * h * dv, seed + 2);
    beta = random_floats(tokens * h, seed + 3, 0.05f, 0.95f);
    g.assign(tokens * h, 0.0f);
    if (decays) {
      for (float& x : g) x = std::log(0.8f + 0.2f * (0.5f + 0.5f * std::sin(float(&x - g.data()) * 1.7f)));
    }
    state = random_floats(size_t(*std::max_element(slots.begin(), slots.end()) + 1) * h * dk * dv, seed + 4, -0.5f, 0.5f);
    scale = 1.0f / std::sqrt(float(dk));
  }

  static std::vector<float> unit_rows(size_t rows, uint32_t width, uint64_t seed) {
    std::vector<float> x = random_floats(rows * width, seed);
    for (size_t r = 0; r < rows; ++r) {
      float n = 0;
      for (uint32_t i = 0; i < width; ++i) n += x[r * width + i] * x[r * width + i];
      for (uint32_t i = 0; i < width; ++i) x[r * width + i] /= std::sqrt(n);
    }
    return x;
  }

  // The CPU reference, sequence by sequence, on a copy of the state pool.
  void reference(std::vector<float>& out, std::vector<float>& pool) const {
    out.assign(q.size() / d_k * d_v, 0.0f);
    pool = state;
    const reference::GatedDeltaShape shape{int(heads), int(d_k), int(d_v)};
    const size_t per_state = size_t(heads) * d_k * d_v;
    for (size_t s = 0; s < lengths.size(); ++s) {
      const size_t t0 = cu[s], n = lengths[s];
      reference::GatedDeltaInputs in;
      in.q = std::span(q).subspan(t0 * heads * d_k, n * heads * d_k);
      in.k = std::span(k).subspan(t0 * heads * d_k, n * heads * d_k);
      in.v = std::span(v).subspan(t0 * heads * d_v, n * heads * d_v);
      in.g = std::span(g).subspan(t0 * heads, n * heads);
      in.beta = std::span(beta).subspan(t0 * heads, n * heads);
      in.tokens = int(n);
      in.scale = scale;
      auto state_of = std::span(pool).subspan(slots[s] * per_state, per_state);
      if (ranges.empty()) {
        reference::gated_delta_recurrent(shape, in, state_of, std::span(out).subspan(t0 * heads * d_v, n * heads * d_v));
        continue;
      }
      // Token by token before the chunks, the chunk form over them, token by token after.
      size_t at = 0;
      for (int part = 0; part < 3; ++part) {
        const size_t m = size_t(ranges[s * 3 + part]);
        reference::GatedDeltaInputs p = in;
        p.q = in.q.subspan(at * heads * d_k, m * heads * d_k);
        p.k = in.k.subspan(at * heads * d_k, m * heads * d_k);
        p.v = in.v.subspan(at * heads * d_v, m * heads * d_v);
        p.g = in.g.subspan(at * heads, m * heads);
        p.beta = in.beta.subspan(at * heads, m * heads);
        p.tokens = int(m);
        auto o = std::span(out).subspan((t0 + at) * heads * d_v, m * heads * d_v);
        if (part == 1) reference::gated_delta_chunked(shape, p, 16, state_of, o);
        else reference::gated_delta_recurrent(shape, p, state_of, o);
        at += m;
      }
    }
  }

  // The kernel's outputs and state pool.
  Status gpu_run(std::vector<float>& out, std::vector<float>& pool) const {
    GpuBuffer gq = to_gpu(q), gk = to_gpu(k), gv = to_gpu(v), gg = to_gpu(g), gb = to_gpu(beta);
    GpuBuffer gs = to_gpu(state), gcu = to_gpu(cu), gslots = to_gpu(slots);
    GpuBuffer gout = to_gpu(std::vector<float>(q.size() / d_k * d_v, 0.0f));
    GatedDeltaBatch b;
    b.q = gq.address(), b.k = gk.address(), b.v = gv.address(), b.g = gg.address(), b.beta = gb.address();
    b.out = gout.address(), b.state = gs.address(), b.cu_tokens = gcu.address(), b.state_slots = gslots.address();
    b.sequences = uint32_t(lengths.size()), b.heads = heads, b.d_k = d_k, b.d_v = d_v, b.scale = scale;
    b.max_tokens = uint32_t(*std::max_element(lengths.begin(), lengths.end()));
    GpuBuffer granges = to_gpu(ranges.empty() ? std::vector<int32_t>{0} : ranges);
    const size_t scratch_floats =
        size_t(cu.back()) * GatedDeltaRule::chunk_scratch_bytes(heads, d_k, d_v) / 4;
    GpuBuffer gscratch = to_gpu(std::vector<float>(scratch_floats, 0.0f));
    b.chunk_scratch = gscratch.address();
    GatedDeltaRule rule(gpu());
    KVTIER_ASSIGN_OR_RETURN(CommandBatch batch, CommandBatch::begin(gpu()));
    if (ranges.empty()) {
      KVTIER_RETURN_IF_ERROR(rule.record(batch, b));
    } else {
      b.ranges = granges.address();
      for (size_t s = 0; s < lengths.size(); ++s) {
        b.max_before = std::max<uint32_t>(b.max_before, ranges[s * 3]);
        b.max_chunks = std::max<uint32_t>(b.max_chunks, ranges[s * 3 + 1] / 16);
        b.max_after = std::max<uint32_t>(b.max_after, ranges[s * 3 + 2]);
      }
      KVTIER_RETURN_IF_ERROR(rule.record_all_parts(batch, b));
    }
    KVTIER_RETURN_IF_ERROR(batch.submit_and_wait());
    out = from_gpu<float>(gout, q.size() / d_k * d_v);
    pool = from_gpu<float>(gs, state.size());
    return ok_status();
  }
};

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

TEST(GatedDeltaKernelTest, TheChunkFormMatchesTheReferencesWithinRounding) {
  // Whole chunks only; a few rows before them and none after; rows on both sides; d_v 48.
  Batch batch(2, 64, 48, {48, 37, 130}, {2, 0, 1}, /*decays=*/true, 21);
  batch.ranges = {0, 48, 0, 5, 32, 0, 3, 112, 15};
  std::vector<float> want_out, want_state, got_out, got_state, plain_out, plain_state;
  batch.reference(want_out, want_state);
  ASSERT_TRUE(batch.gpu_run(got_out, got_state).ok());
  EXPECT_LT(max_abs_diff(got_out, want_out), 1e-4f);
  EXPECT_LT(max_abs_diff(got_state, want_state), 1e-4f);
  Batch plain = batch;
  plain.ranges.clear();
  plain.reference(plain_out, plain_state);  // the recurrence: the same rule
  EXPECT_LT(max_abs_diff(got_out, plain_out), 1e-4f);
  EXPECT_LT(max_abs_diff(got_state, plain_state), 1e-4f);
  std::cout << "chunk form vs CPU chunk form: out " << max_abs_diff(got_out, want_out) << ", state "
            << max_abs_diff(got_state, want_state) << "; vs the recurrence: out " << max_abs_diff(got_out, plain_out)
            << "\n";
  // A wrong decay is seen: the bound is tight enough to fail.
  Batch wrong = batch;
  for (float& x : wrong.g) x *= 1.05f;
  std::vector<float> wrong_out, wrong_state;
  wrong.reference(wrong_out, wrong_state);
  EXPECT_GT(max_abs_diff(got_out, wrong_out), 1e-3f);
}

TEST(GatedDeltaKernelTest, TheChunkFormIsTheSameBitsWhateverSharesItsLaunch) {
  Batch both(2, 64, 64, {80, 35}, {0, 1}, /*decays=*/true, 31);
  both.ranges = {0, 80, 0, 1, 32, 2};
  Batch alone(2, 64, 64, {80}, {0}, /*decays=*/true, 31);
  alone.ranges = {0, 80, 0};
  std::vector<float> both_out, both_state, alone_out, alone_state;
  ASSERT_TRUE(both.gpu_run(both_out, both_state).ok());
  ASSERT_TRUE(alone.gpu_run(alone_out, alone_state).ok());
  const size_t n = alone_out.size(), per_state = size_t(2) * 64 * 64;
  EXPECT_EQ(std::memcmp(both_out.data(), alone_out.data(), n * 4), 0);
  EXPECT_EQ(std::memcmp(both_state.data(), alone_state.data(), per_state * 4), 0);
}

TEST(GatedDeltaKernelTest, TheChunkFormSplitAtAChunkEdgeGivesTheBitsOfOneCall) {
  // d_k = d_v = 128 (a full set of column groups); 1900 rows, more chunks than lavapipe's one
  // launch of the state's pass takes, so that call is cut into stretches too.
  Batch whole(1, 128, 128, {1900}, {0}, /*decays=*/true, 41);
  whole.ranges = {5, 1888, 7};
  std::vector<float> whole_out, whole_state, want_out, want_state;
  ASSERT_TRUE(whole.gpu_run(whole_out, whole_state).ok());
  whole.reference(want_out, want_state);
  EXPECT_LT(max_abs_diff(whole_out, want_out), 1e-4f);
  EXPECT_LT(max_abs_diff(whole_state, want_state), 1e-4f);
  // The same rows in two calls, the state carried through memory: rows [0, 965), then the rest.
  auto part = [&](size_t from, size_t to, std::vector<int32_t> ranges) {
    Batch p(1, 128, 128, {int32_t(to - from)}, {0}, /*decays=*/true, 41);
    auto rows = [&](const std::vector<float>& x, size_t width) {
      return std::vector<float>(x.begin() + from * width, x.begin() + to * width);
    };
    p.q = rows(whole.q, 128), p.k = rows(whole.k, 128), p.v = rows(whole.v, 128);
    p.g = rows(whole.g, 1), p.beta = rows(whole.beta, 1);
    p.ranges = std::move(ranges);
    return p;
  };
  Batch first = part(0, 965, {5, 960, 0}), second = part(965, 1900, {0, 928, 7});
  std::vector<float> out1, state1, out2, state2;
  first.state = whole.state;
  ASSERT_TRUE(first.gpu_run(out1, state1).ok());
  second.state = state1;
  ASSERT_TRUE(second.gpu_run(out2, state2).ok());
  out1.insert(out1.end(), out2.begin(), out2.end());
  EXPECT_EQ(std::memcmp(out1.data(), whole_out.data(), whole_out.size() * 4), 0)
      << "max difference " << max_abs_diff(out1, whole_out);
  EXPECT_EQ(std::memcmp(state2.data(), whole_state.data(), whole_state.size() * 4), 0);
}

TEST(GatedDeltaKernelTest, WithoutDecayItGivesTheReferencesBits) {
  // Three sequences (one token, a few, more than a block size) in permuted state slots; d_v 48
  // leaves most of a workgroup's columns idle.
  const Batch batch(2, 64, 48, {1, 37, 130}, {2, 0, 1}, /*decays=*/false, 11);
  std::vector<float> want_out, want_state, got_out, got_state;
  batch.reference(want_out, want_state);
  ASSERT_TRUE(batch.gpu_run(got_out, got_state).ok());
  EXPECT_EQ(std::memcmp(got_out.data(), want_out.data(), want_out.size() * 4), 0)
      << "max difference " << max_abs_diff(got_out, want_out);
  EXPECT_EQ(std::memcmp(got_state.data(), want_state.data(), want_state.size() * 4), 0)
      << "max difference " << max_abs_diff(got_state, want_state);
}

TEST(GatedDeltaKernelTest, WithDecaysItStaysWithinExpsPrecision) {
  const Batch batch(2, 128, 128, {5, 64, 200}, {0, 1, 2}, /*decays=*/true, 12);
  std::vector<float> want_out, want_state, got_out, got_state;
  batch.reference(want_out, want_state);
  ASSERT_TRUE(batch.gpu_run(got_out, got_state).ok());
  const float out_diff = max_abs_diff(got_out, want_out), state_diff = max_abs_diff(got_state, want_state);
  EXPECT_LT(out_diff, 1e-5f);
  EXPECT_LT(state_diff, 1e-5f);
  std::cout << "  max difference: outputs " << out_diff << ", states " << state_diff << "\n";
}

TEST(GatedDeltaKernelTest, ASequenceIsTheSameBitsWhateverSharesItsLaunch) {
  const Batch all(2, 64, 64, {20, 33, 7}, {0, 1, 2}, /*decays=*/true, 13);
  std::vector<float> all_out, all_state;
  ASSERT_TRUE(all.gpu_run(all_out, all_state).ok());
  // The middle sequence alone, from the same state.
  Batch alone(2, 64, 64, {33}, {1}, /*decays=*/true, 13);
  const size_t t0 = 20, n = 33, H = 2;
  auto slice = [&](const std::vector<float>& x, size_t width) {
    return std::vector<float>(x.begin() + t0 * H * width, x.begin() + (t0 + n) * H * width);
  };
  alone.q = slice(all.q, 64), alone.k = slice(all.k, 64), alone.v = slice(all.v, 64);
  alone.g = slice(all.g, 1), alone.beta = slice(all.beta, 1);
  alone.state = all.state;
  std::vector<float> one_out, one_state;
  ASSERT_TRUE(alone.gpu_run(one_out, one_state).ok());
  EXPECT_EQ(std::memcmp(one_out.data(), all_out.data() + t0 * H * 64, one_out.size() * 4), 0);
  const size_t per_state = H * 64 * 64;
  EXPECT_EQ(std::memcmp(one_state.data() + per_state, all_state.data() + per_state, per_state * 4), 0);
}

TEST(GatedDeltaKernelTest, ALongSequenceIsCutIntoLaunchesWithoutChangingItsBits) {
  // 1000 tokens at d_k 128: in one launch lavapipe went wrong from token ~166 on (about 65000
  // loop iterations; it fails with the stretches removed); in stretches the bits are the reference's.
  const Batch batch(1, 128, 16, {1000, 3}, {0, 1}, /*decays=*/false, 14);
  std::vector<float> want_out, want_state, got_out, got_state;
  batch.reference(want_out, want_state);
  ASSERT_TRUE(batch.gpu_run(got_out, got_state).ok());
  EXPECT_EQ(std::memcmp(got_out.data(), want_out.data(), want_out.size() * 4), 0)
      << "max difference " << max_abs_diff(got_out, want_out);
  EXPECT_EQ(std::memcmp(got_state.data(), want_state.data(), want_state.size() * 4), 0);
}

// causal_conv1d.comp: the pre-activation sums are the reference's bits (same order, no fused
// multiply-adds); SiLU's exp may differ from the C library's by Vulkan's 3 + 2|s| ulp, here
// |s| < 3 (inputs and weights in [-1, 1], width 4, a bias), so outputs agree within 1e-6 relative
// (tolerance 1e-5 of max(1, |y|)); the windows are copies of inputs: bit-exact.
TEST(CausalConv1dKernelTest, MatchesTheReferenceAndLeavesEachSequencesLastInputs) {
  const uint32_t channels = 70, width = 4, past = width - 1;  // 70: a partial second workgroup
  const std::vector<int32_t> lengths = {1, 2, 37, 5000};      // 5000: two launches' stretches
  const std::vector<int32_t> slots = {3, 0, 2, 1};
  std::vector<int32_t> cu = {0};
  for (int32_t n : lengths) cu.push_back(cu.back() + n);
  const size_t tokens = cu.back();
  const std::vector<float> x = random_floats(tokens * channels, 21), w = random_floats(channels * width, 22);
  const std::vector<float> bias = random_floats(channels, 23);
  const std::vector<float> windows = random_floats(4 * channels * past, 24);
  // The reference, sequence by sequence.
  std::vector<float> want_y(tokens * channels), want_windows = windows;
  for (size_t s = 0; s < lengths.size(); ++s) {
    reference::causal_conv1d_silu(std::span(x).subspan(cu[s] * channels, lengths[s] * channels), lengths[s],
                                  channels, w, width, bias,
                                  std::span(want_windows).subspan(slots[s] * channels * past, channels * past),
                                  std::span(want_y).subspan(cu[s] * channels, lengths[s] * channels));
  }
  GpuBuffer gx = to_gpu(x), gw = to_gpu(w), gb = to_gpu(bias), gwin = to_gpu(windows);
  GpuBuffer gy = to_gpu(std::vector<float>(tokens * channels, 0.0f)), gcu = to_gpu(cu), gslots = to_gpu(slots);
  CausalConvBatch b;
  b.x = gx.address(), b.weight = gw.address(), b.bias = gb.address(), b.window = gwin.address(), b.y = gy.address();
  b.cu_tokens = gcu.address(), b.window_slots = gslots.address();
  b.sequences = 4, b.channels = channels, b.width = width, b.max_tokens = 5000;
  CausalConv1d conv(gpu());
  auto batch = std::move(CommandBatch::begin(gpu())).value();
  ASSERT_TRUE(conv.record(batch, b).ok());
  ASSERT_TRUE(batch.submit_and_wait().ok());
  const std::vector<float> got_y = from_gpu<float>(gy, tokens * channels);
  const std::vector<float> got_windows = from_gpu<float>(gwin, windows.size());
  double worst = 0;
  for (size_t i = 0; i < got_y.size(); ++i) {
    const double err = std::abs(got_y[i] - want_y[i]) / std::max(1.0f, std::abs(want_y[i]));
    ASSERT_LT(err, 1e-5) << "element " << i;
    worst = std::max(worst, err);
  }
  std::cout << "  worst relative difference " << worst << "\n";
  EXPECT_EQ(std::memcmp(got_windows.data(), want_windows.data(), windows.size() * 4), 0);
}

TEST(CausalConv1dKernelTest, RefusesWidthsPastItsRegisters) {
  CausalConv1d conv(gpu());
  auto batch = std::move(CommandBatch::begin(gpu())).value();
  CausalConvBatch b;
  b.sequences = 1, b.channels = 8, b.width = 9;
  EXPECT_EQ(conv.record(batch, b).code(), StatusCode::kInvalidArgument);
  b.width = 0;
  EXPECT_EQ(conv.record(batch, b).code(), StatusCode::kInvalidArgument);
}

TEST(GatedDeltaKernelTest, RefusesHeadDimsPastItsRegisters) {
  GatedDeltaRule rule(gpu());
  auto batch = std::move(CommandBatch::begin(gpu())).value();
  GatedDeltaBatch b;
  b.sequences = 1, b.heads = 1, b.d_k = 256, b.d_v = 64;
  EXPECT_EQ(rule.record(batch, b).code(), StatusCode::kInvalidArgument);
  b.d_k = 64, b.d_v = 0;
  EXPECT_EQ(rule.record(batch, b).code(), StatusCode::kInvalidArgument);
  // The chunk form needs its ranges and scratch, and d_k in multiples of 16.
  b.d_v = 64, b.max_chunks = 1, b.ranges = 0x1000;
  EXPECT_EQ(rule.record_chunks(batch, b).code(), StatusCode::kInvalidArgument) << "no scratch";
  b.chunk_scratch = 0x2000, b.d_k = 24;
  EXPECT_EQ(rule.record_chunks(batch, b).code(), StatusCode::kInvalidArgument) << "d_k 24";
}

}  // namespace
}  // namespace kvtier
