// The attention triangle: the CPU reference, the decode kernel and the varlen kernel must agree on
// random inputs across dtypes, head dims, GQA ratios, block sizes, context lengths (1, a block
// edge, several blocks, longer than one split), sliding windows and soft-capping.
//
// Tolerance: K and V are exact in every dtype (the kernels convert them losslessly to f32), so the
// dtype changes no rounding; what differs is the order of f32 sums (dot products over head_dim,
// softmax denominators, weighted sums over up to ~1100 tokens) and the GPU's exp/tanh, accurate to
// a few ulp. With |q| <= 0.5, |k|, |v| < 4, scores stay within about +-12 and outputs within +-4.
// Measured worst error, relative to 1 + |reference|: 6e-7 (2e-6 with soft-capping) on lavapipe.
// The bound, 5e-5 (1e-4 with soft-capping), leaves room for a GPU's approximate exp and tanh
// (a few ulp each, NVIDIA's being the loosest), while a wrong index, mask or scale moves outputs
// by far more.
#include <gtest/gtest.h>
#include <malloc.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <optional>

#include "engine/attention/paged_attention.h"
#include "engine/reference/reference_attention.h"
#include "kernels/spirv_registry.h"
#include "serialize/dtype.h"
#include "tests/engine/engine_test_env.h"
#include "tests/engine/paged_problem.h"
#include "tests/support/test_blocks.h"

namespace kvtier {
namespace {

using testing::AttnCase;
using testing::from_gpu;
using testing::gpu;
using testing::PagedProblem;
using testing::to_gpu;

void expect_close(const std::vector<float>& a, const std::vector<float>& b, float tol, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  float worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const float err = std::fabs(a[i] - b[i]) / (1.0f + std::fabs(b[i]));
    ASSERT_FALSE(std::isnan(a[i])) << what << " NaN at " << i;
    if (err > worst) {
      worst = err;
      at = i;
    }
  }
  EXPECT_LE(worst, tol) << what << ": worst relative error at " << at << " (" << a[at] << " vs "
                        << b[at] << ")";
  std::cout << "  " << what << ": worst relative error " << worst << "\n";
}

using Path = PagedAttentionVarlen::Path;

// Cooperative matrices take q, K, V and the softmax weights as f16 (11-bit significands, against
// f32's 24): each q_d * k_d is off by up to 2^-10 relative, so a score by up to
// scale * 2^-10 * sum |q_d k_d| — with these inputs' typical magnitudes (random signs, |q| <= 0.5,
// |k|, |v| < 4, head_dim <= 128) a few 1e-4, worst cases ~1e-2 — and each weight and value by
// 2^-11 more. Measured worst error on the H100, relative to 1 + |reference|: 2.7e-4 to 7.8e-4
// over these shapes. The bound, 4e-3, is five times that and still far below what a wrong row,
// mask or scale does (errors of order 1).
float tolerance(Path path, const AttnCase& c) {
  if (path != Path::kScalar) return 4e-3f;  // both tensor-core paths take f16 inputs
  return c.softcap > 0 ? 1e-4f : 5e-5f;
}

class AttentionTriangleTest : public ::testing::TestWithParam<AttnCase> {};

TEST_P(AttentionTriangleTest, ReferenceDecodeAndVarlenAgree) {
  const AttnCase& c = GetParam();
  PagedProblem s(c, std::vector<int>(c.lens.size(), 1));
  const float tol = c.softcap > 0 ? 1e-4f : 5e-5f;
  const auto ref = s.reference(c);
  const auto dec = s.decode();
  const auto var = s.varlen();
  expect_close(dec, ref, tol, "decode vs reference");
  expect_close(var, ref, tol, "varlen vs reference");
  expect_close(dec, var, tol, "decode vs varlen");
}

TEST_P(AttentionTriangleTest, VarlenPrefillMatchesTheReferenceRowByRow) {
  AttnCase c = GetParam();
  // Several query rows per sequence (a chunked prefill: the last q_len positions of each).
  std::vector<int> q_lens;
  for (int len : c.lens) q_lens.push_back(std::min(len, 1 + len / 3));
  PagedProblem s(c, q_lens);
  const auto ref = s.reference(c);
  for (Path path : testing::compute_paths(s.view, static_cast<uint32_t>(s.num_heads))) {
    expect_close(s.varlen(PagedAttentionVarlen::SplitPolicy::kAuto, path), ref, tolerance(path, c),
                 (std::string("varlen prefill, ") + PagedAttentionVarlen::path_name(path)).c_str());
  }
}

// The property prefix restore stands on: a row's output bits depend on its own tokens only. The
// same rows computed walking the splits in one workgroup, with a workgroup per split, and as the
// lone query of a decode-shaped batch (only each sequence's last row) must be identical.
TEST_P(AttentionTriangleTest, VarlenRowsAreTheSameBitsWhateverShareTheirLaunch) {
  using Policy = PagedAttentionVarlen::SplitPolicy;
  const AttnCase& c = GetParam();
  std::vector<int> q_lens;
  for (int len : c.lens) q_lens.push_back(std::min(len, 1 + len / 3));
  PagedProblem full(c, q_lens);
  PagedProblem last(c, std::vector<int>(c.lens.size(), 1));
  const size_t row = static_cast<size_t>(full.num_heads) * c.head_dim;
  for (size_t s = 0; s < c.lens.size(); ++s) {  // sequence s's last query row, as a decode step
    std::copy_n(full.q.begin() + (full.cu[s + 1] - 1) * row, row, last.q.begin() + s * row);
  }
  last.gq = to_gpu(last.q);
  for (Path path : testing::compute_paths(full.view, static_cast<uint32_t>(full.num_heads))) {
    SCOPED_TRACE(PagedAttentionVarlen::path_name(path));
    const auto walk = full.varlen(Policy::kWalkSplits, path);
    const auto per_split = full.varlen(Policy::kWorkgroupPerSplit, path);
    EXPECT_EQ(std::memcmp(walk.data(), per_split.data(), walk.size() * 4), 0);
    for (Policy policy : {Policy::kWalkSplits, Policy::kWorkgroupPerSplit}) {
      const auto one = last.varlen(policy, path);
      for (size_t s = 0; s < c.lens.size(); ++s) {
        EXPECT_EQ(std::memcmp(one.data() + s * row, walk.data() + (full.cu[s + 1] - 1) * row, row * 4), 0)
            << "sequence " << s << ", policy " << static_cast<int>(policy);
      }
    }
  }
}

// Decode in one launch: the last workgroup of a row merges its splits in split order and resets
// the row's ticket. So a row's bits are the same alone as in a batch, launch after launch on the
// same tickets (a ticket left behind would leave later rows unmerged), many launches in one batch.
// Every sequence's decode rows, batched; checks that `launches` launches in one batch give the
// same bits (on one launcher's tickets) and each sequence alone does too.
std::vector<float> decode_expecting_the_same_bits(PagedProblem& s, int launches) {
  PagedAttentionDecode kernel(gpu());
  const auto batched = s.decode(std::nullopt, 1, &kernel);
  const auto again = s.decode(std::nullopt, launches, &kernel);
  EXPECT_EQ(std::memcmp(batched.data(), again.data(), batched.size() * 4), 0);
  const size_t row = static_cast<size_t>(s.num_heads) * s.view.head_dim;
  for (size_t q = 0; q < s.lens.size(); ++q) {
    const auto alone = s.decode(q, 1, &kernel);
    EXPECT_EQ(std::memcmp(alone.data(), batched.data() + q * row, row * 4), 0) << "sequence " << q;
  }
  return batched;
}

TEST_P(AttentionTriangleTest, DecodeRowsAreTheSameBitsAloneBatchedAndLaunchAfterLaunch) {
  const AttnCase& c = GetParam();
  PagedProblem s(c, std::vector<int>(c.lens.size(), 1));
  decode_expecting_the_same_bits(s, 3);
}

// Rows of more than 64 splits (16k tokens) merge in two levels: groups of 16 splits, then the
// groups. Such rows must match the reference, keep their bits alone, batched with short rows and
// launch after launch (a group ticket left behind would leave later launches unmerged), with a
// window that masks whole groups. Lengths: 65 splits (a last group of one), 71 (of 7), 67
// (windowed: the first groups see nothing), and a short row (one level) beside them.
TEST(AttentionDecodeTest, LongRowsMergeInTwoLevelsAndKeepTheirBits) {
  for (int window : {0, 5000}) {
    SCOPED_TRACE("window " + std::to_string(window));
    const AttnCase c{"long", DType::kBF16, 64, 4, 2, 16, {16400, 18000, 300, 17000}, 0.0f, window};
    PagedProblem s(c, std::vector<int>(c.lens.size(), 1));
    expect_close(decode_expecting_the_same_bits(s, 2), s.reference(c), 5e-5f, "decode vs reference");
  }
}

// A context longer than the device's grid can hold splits of (splits are the grid's x), or more
// sequences than its z holds, is refused before anything is recorded (such a dispatch is invalid
// usage in Vulkan: undefined behaviour, not a clear error).
TEST(AttentionDecodeTest, RefusesAContextBeyondTheDevicesGrid) {
  PagedKvView view{0, 0, 64, 16, 8, 128, DType::kBF16};
  PagedAttentionDecode kernel(gpu());
  const uint32_t split = kernel.split_tokens(view, 4);
  ASSERT_GT(split, 0u);
  auto expect_refused = [&](const DecodeBatch& b) {
    auto batch = std::move(CommandBatch::begin(gpu())).value();
    Status st = kernel.record(batch, b, view, AttentionOptions{0.1f, 0, 0});
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.message().find("exceeds the device's grid"), std::string::npos) << st.to_string();
    EXPECT_TRUE(batch.submit_and_wait().ok());  // nothing half-recorded
  };
  const uint64_t too_many_seqs = uint64_t{gpu().info().max_workgroup_count[2]} + 1;
  if (too_many_seqs <= UINT32_MAX) {
    expect_refused(DecodeBatch{0, 0, 0, 1, 0, static_cast<uint32_t>(too_many_seqs), 512, 32});
  }
  const uint64_t too_long = (uint64_t{gpu().info().max_workgroup_count[0]} + 1) * split;
  if (too_long > UINT32_MAX) GTEST_SKIP() << "this device's grid holds every context a DecodeBatch can name";
  expect_refused(DecodeBatch{0, 0, 0, 1, 0, 1, static_cast<uint32_t>(too_long), 32});
}

// A launch that needs larger scratch buffers than the launcher holds may share a batch with
// launches recorded before it: the buffers those use stay alive until the batch is done. On
// lavapipe device memory is host memory; with glibc told to mmap every allocation of 64 KiB or
// more, freeing the first launch's 1 MiB of partials at record time unmaps what it then writes to
// (checked: the test crashes without the batch keeping them). Both launches must still give the
// reference's rows.
TEST(AttentionDecodeTest, ALaunchThatOutgrowsTheScratchBuffersLeavesEarlierLaunchesIntact) {
  mallopt(M_MMAP_THRESHOLD, 64 << 10);  // this test's process only (ctest runs each test alone)
  const AttnCase c{"grow", DType::kBF16, 128, 4, 2, 16, {600, 700, 650}};
  PagedProblem s(c, {1, 1, 1});
  const auto ref = s.reference(c);
  const size_t row = static_cast<size_t>(s.num_heads) * c.head_dim;
  PagedAttentionDecode kernel(gpu());
  GpuBuffer first = testing::gpu_zeros(row * 4), all = testing::gpu_zeros(3 * row * 4);
  auto batch = std::move(CommandBatch::begin(gpu())).value();
  const uint32_t heads = static_cast<uint32_t>(s.num_heads), blocks = static_cast<uint32_t>(s.max_blocks);
  // max_seq_len is an upper bound: 64k tokens size a grid of 256 splits of 256 tokens (1 MiB of
  // partials) for the first launch, and the second launch's three sequences need three times
  // that and more tickets than the first one's.
  Status st = kernel.record(batch, DecodeBatch{s.gq.address(), first.address(), s.gtables.address(), blocks,
                                               s.glens.address(), 1, 1u << 16, heads},
                            s.view, s.options);
  ASSERT_TRUE(st.ok()) << st.to_string();
  st = kernel.record(batch, DecodeBatch{s.gq.address(), all.address(), s.gtables.address(), blocks,
                                        s.glens.address(), 3, 1u << 16, heads},
                     s.view, s.options);
  ASSERT_TRUE(st.ok()) << st.to_string();
  ASSERT_TRUE(batch.submit_and_wait().ok());
  expect_close(from_gpu<float>(first, row), std::vector<float>(ref.begin(), ref.begin() + row), 5e-5f,
               "the earlier launch");
  expect_close(from_gpu<float>(all, 3 * row), ref, 5e-5f, "the larger launch");
}

// Shapes the kernels cannot take are refused before anything is recorded, by both launchers: a
// block size of 0 (the kernels divide by it), heads that do not group, a head_dim past 256.
TEST(AttentionLaunchersTest, RefuseShapesTheKernelsCannotTake) {
  const PagedKvView good{0, 0, 64, 16, 8, 128, DType::kBF16};
  PagedKvView no_blocks = good, odd_heads = good, wide = good;
  no_blocks.block_size = 0;
  odd_heads.num_kv_heads = 5;
  wide.head_dim = 264;
  const std::vector<int32_t> cu{0, 1};
  for (const PagedKvView& view : {no_blocks, odd_heads, wide}) {
    auto batch = std::move(CommandBatch::begin(gpu())).value();
    PagedAttentionDecode decode(gpu());
    Status st = decode.record(batch, DecodeBatch{0, 0, 0, 1, 0, 1, 16, 32}, view, AttentionOptions{0.1f, 0, 0});
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    PagedAttentionVarlen varlen(gpu());
    st = varlen.record(batch, VarlenBatch{0, 0, 0, 1, 0, 0, cu, 32, 16}, view, AttentionOptions{0.1f, 0, 0});
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    if (view.num_kv_heads == good.num_kv_heads) {
      EXPECT_EQ(decode.split_tokens(view, 4), 0u);  // no split size
    }
    EXPECT_TRUE(batch.submit_and_wait().ok());  // nothing half-recorded
  }
}

// A launcher may go before the batch it recorded into runs: the batch holds its scratch (partials,
// tickets, tile tables). With the launcher owning them alone, its destructor frees them under the
// recorded commands (checked: on lavapipe, with the mmap threshold below, the test then crashes).
TEST(AttentionLaunchersTest, MayGoBeforeTheBatchesTheyRecordedInto) {
  mallopt(M_MMAP_THRESHOLD, 64 << 10);  // as above
  const AttnCase c{"gone", DType::kBF16, 128, 4, 2, 16, {600, 300}};
  PagedProblem s(c, {1, 300});
  const auto ref = s.reference(c);
  const size_t row = static_cast<size_t>(s.num_heads) * c.head_dim;
  const uint32_t heads = static_cast<uint32_t>(s.num_heads), blocks = static_cast<uint32_t>(s.max_blocks);
  GpuBuffer decoded = testing::gpu_zeros(row * 4), prefilled = testing::gpu_zeros(300 * row * 4);
  const std::vector<int32_t> cu{0, 300};
  GpuBuffer gcu = to_gpu(cu);
  const Path path = PagedAttentionVarlen::default_path(gpu());
  auto batch = std::move(CommandBatch::begin(gpu())).value();
  {
    PagedAttentionDecode decode(gpu());
    // 64k tokens of grid: 1 MiB of partials, past the mmap threshold.
    Status st = decode.record(batch, DecodeBatch{s.gq.address(), decoded.address(), s.gtables.address(), blocks,
                                                 s.glens.address(), 1, 1u << 16, heads},
                              s.view, s.options);
    ASSERT_TRUE(st.ok()) << st.to_string();
    PagedAttentionVarlen varlen(gpu(), PagedAttentionVarlen::SplitPolicy::kWorkgroupPerSplit, path);
    st = varlen.record(batch, VarlenBatch{s.gq.address() + row * 4, prefilled.address(),
                                          s.gtables.address() + blocks * 4, blocks, s.glens.address() + 4,
                                          gcu.address(), cu, heads, 300},  // 2.5 MiB of partials
                       s.view, s.options);
    ASSERT_TRUE(st.ok()) << st.to_string();
  }
  ASSERT_TRUE(batch.submit_and_wait().ok());
  expect_close(from_gpu<float>(decoded, row), std::vector<float>(ref.begin(), ref.begin() + row), 5e-5f,
               "decode");
  expect_close(from_gpu<float>(prefilled, 300 * row), std::vector<float>(ref.begin() + row, ref.end()),
               tolerance(path, c), "prefill");
}

// Rows past 16 splits of context: the merge pass loads 16 splits' partials at once, so these
// rows' 18 splits take two of its rounds, the second one short. Merged by it (a workgroup per
// split) or walked in one workgroup, they are the same bits, and the reference's values.
TEST(AttentionVarlenTest, RowsOfMoreSplitsThanTheMergeLoadsAtOnceAreTheSameBitsSplitOrWalked) {
  using Policy = PagedAttentionVarlen::SplitPolicy;
  const AttnCase c{"long", DType::kBF16, 64, 4, 2, 16, {9000}};
  ASSERT_GT(
      (c.lens[0] + PagedAttentionVarlen::kSplitTokens - 1) / PagedAttentionVarlen::kSplitTokens,
      16u);
  PagedProblem s(c, {3});
  const auto ref = s.reference(c);
  for (Path path : testing::compute_paths(s.view, static_cast<uint32_t>(s.num_heads))) {
    SCOPED_TRACE(PagedAttentionVarlen::path_name(path));
    const auto walked = s.varlen(Policy::kWalkSplits, path);
    const auto merged = s.varlen(Policy::kWorkgroupPerSplit, path);
    EXPECT_EQ(std::memcmp(walked.data(), merged.data(), walked.size() * 4), 0);
    expect_close(merged, ref, tolerance(path, c), "merged splits vs reference");
  }
}

// The same for prefill: a second launch with other tiles (and more partials) in the batch leaves
// the first one's tile table and partials as they were. Sequence 1 alone first, then both: with
// one shared table rewritten in place, the first launch reads a later one's tiles, which name a
// sequence its batch does not have (checked: on lavapipe that crashes, as freeing its partials
// early does; handing the first table to the third launch gives the first launch wrong rows).
// A batch dropped unsubmitted leaves the launcher working.
TEST(AttentionVarlenTest, ALaunchWithOtherTilesLeavesEarlierLaunchesIntact) {
  mallopt(M_MMAP_THRESHOLD, 64 << 10);  // as above
  const AttnCase c{"retile", DType::kBF16, 128, 4, 2, 16, {200, 300}};
  PagedProblem s(c, {200, 300});
  const auto ref = s.reference(c);
  const size_t row = static_cast<size_t>(s.num_heads) * c.head_dim;
  for (Path path : testing::compute_paths()) {
    PagedAttentionVarlen kernel(gpu(), PagedAttentionVarlen::SplitPolicy::kWorkgroupPerSplit, path);
    const std::vector<int32_t> cu_one{0, 300};
    GpuBuffer gcu_one = to_gpu(cu_one);
    GpuBuffer one = testing::gpu_zeros(300 * row * 4), both = testing::gpu_zeros(500 * row * 4);
    const uint32_t heads = static_cast<uint32_t>(s.num_heads), blocks = static_cast<uint32_t>(s.max_blocks);
    auto batch = std::move(CommandBatch::begin(gpu())).value();
    const VarlenBatch alone{s.gq.address() + 200 * row * 4, one.address(), s.gtables.address() + blocks * 4,
                            blocks, s.glens.address() + 4, gcu_one.address(), cu_one, heads, 300};
    Status st = kernel.record(batch, alone, s.view, s.options);
    ASSERT_TRUE(st.ok()) << st.to_string();
    st = kernel.record(batch, VarlenBatch{s.gq.address(), both.address(), s.gtables.address(), blocks,
                                          s.glens.address(), s.gcu.address(), s.cu, heads, 300},
                       s.view, s.options);
    ASSERT_TRUE(st.ok()) << st.to_string();
    // A third tiling (sequence 0's last row as a decode row, then all of sequence 1): its table
    // must not be the first launch's, though that one is no longer the launcher's latest.
    const std::vector<int32_t> cu_mixed{0, 1, 301};
    GpuBuffer gcu_mixed = to_gpu(cu_mixed), mixed = testing::gpu_zeros(301 * row * 4);
    st = kernel.record(batch, VarlenBatch{s.gq.address() + 199 * row * 4, mixed.address(), s.gtables.address(),
                                          blocks, s.glens.address(), gcu_mixed.address(), cu_mixed, heads, 300},
                       s.view, s.options);
    ASSERT_TRUE(st.ok()) << st.to_string();
    ASSERT_TRUE(batch.submit_and_wait().ok());
    expect_close(from_gpu<float>(one, 300 * row), std::vector<float>(ref.begin() + 200 * row, ref.end()),
                 tolerance(path, c), "the earlier launch");
    expect_close(from_gpu<float>(both, 500 * row), ref, tolerance(path, c), "the later launch");
    expect_close(from_gpu<float>(mixed, 301 * row), std::vector<float>(ref.begin() + 199 * row, ref.end()),
                 tolerance(path, c), "the third launch");
    // A batch that is recorded but never submitted writes nothing: the next batch that launches
    // over its tiles writes them again.
    {
      auto dropped = std::move(CommandBatch::begin(gpu())).value();
      ASSERT_TRUE(kernel.record(dropped, alone, s.view, s.options).ok());
    }
    auto again = std::move(CommandBatch::begin(gpu())).value();
    GpuBuffer redo = testing::gpu_zeros(300 * row * 4);
    VarlenBatch alone_again = alone;
    alone_again.out = redo.address();
    ASSERT_TRUE(kernel.record(again, alone_again, s.view, s.options).ok());
    ASSERT_TRUE(again.submit_and_wait().ok());
    expect_close(from_gpu<float>(redo, 300 * row), std::vector<float>(ref.begin() + 200 * row, ref.end()),
                 tolerance(path, c), "after a dropped batch");
  }
}

// The path is settled from the device and the cache's shape: the same for every batch a launcher
// records (the signature has no batch to look at), the scalar one where cooperative matrices are
// missing or the shape does not suit them, and the device's fastest by default.
TEST(AttentionPathTest, ChosenFromTheDeviceAndShapeAlone) {
  const bool coopmat = gpu().info().coopmat_mma_fragments, coopmat2 = gpu().info().coopmat2;
  const Path below2 = coopmat ? Path::kCoopMat : Path::kScalar;  // what a device without coopmat2 takes
  EXPECT_EQ(PagedAttentionVarlen::default_path(gpu()), gpu().info().prefer_coopmat2 ? Path::kCoopMat2 : below2);
  PagedKvView view{0, 0, 64, 16, 8, 128, DType::kBF16};
  PagedAttentionVarlen preferring_coopmat2(gpu(), PagedAttentionVarlen::SplitPolicy::kAuto, Path::kCoopMat2);
  EXPECT_EQ(preferring_coopmat2.path(view, 32), coopmat2 ? Path::kCoopMat2 : below2);
  PagedAttentionVarlen preferring_coopmat(gpu(), PagedAttentionVarlen::SplitPolicy::kAuto, Path::kCoopMat);
  EXPECT_EQ(preferring_coopmat.path(view, 32), below2);
  PagedAttentionVarlen scalar(gpu(), PagedAttentionVarlen::SplitPolicy::kAuto, Path::kScalar);
  EXPECT_EQ(scalar.path(view, 32), Path::kScalar);
  view.head_dim = 256;  // past the coopmat2 kernel's tiles: the next path down
  EXPECT_EQ(preferring_coopmat2.path(view, 32), below2);
  view.head_dim = 72;  // not a multiple of the 16-wide tiles
  EXPECT_EQ(preferring_coopmat2.path(view, 32), Path::kScalar);
  EXPECT_EQ(preferring_coopmat.path(view, 32), Path::kScalar);
}

// The tensor-core kernel keeps its softmax on the fragments, so it runs only where the start-up
// probe found the fragment layout it assumes. NVIDIA's driver gives that layout (the H100 through
// the device tool): if a driver changed it, attention would fall back to the scalar kernels
// quietly, so this says so on the hardware the figures come from. Lavapipe has no cooperative
// matrices: nothing to probe.
TEST(AttentionPathTest, TensorCoreFragmentsProbedOnNvidia) {
  const DeviceInfo& info = gpu().info();
  if (!info.coopmat_f16) {
    EXPECT_FALSE(info.coopmat_mma_fragments);
    GTEST_SKIP() << "no cooperative matrices on " << info.name;
  }
  if (info.name.find("NVIDIA") == std::string::npos) GTEST_SKIP() << "layout not known for " << info.name;
  EXPECT_TRUE(info.coopmat_mma_fragments);
  EXPECT_EQ(PagedAttentionVarlen::default_path(gpu()), info.prefer_coopmat2 ? Path::kCoopMat2 : Path::kCoopMat);
}

// A build with the cooperative-matrix-2 kernels takes that path on NVIDIA's driver (the H100's
// has VK_NV_cooperative_matrix2): if detection or enabling failed, attention would quietly run the
// older tensor-core kernel, so this says so where the figures come from.
TEST(AttentionPathTest, CooperativeMatrix2OnNvidiaWhenBuiltWithIt) {
  if (spirv_for("paged_attention_varlen_cm2").empty()) GTEST_SKIP() << "built without a glslang >= 15.1";
  const DeviceInfo& info = gpu().info();
  if (info.name.find("NVIDIA") == std::string::npos) {
    EXPECT_FALSE(info.coopmat2) << info.name;
    GTEST_SKIP() << "no cooperative matrix 2 on " << info.name;
  }
  EXPECT_TRUE(info.coopmat2);
  std::cout << "  cooperative matrix 2: workgroups of up to " << info.coopmat2_max_workgroup << " invocations, "
            << info.coopmat2_reserved_shared << " bytes of shared memory reserved\n";
  EXPECT_GE(info.coopmat2_max_workgroup, 256u) << "the kernel's workgroup";
  // The tensor-core kernels' faster spelling (GL_KHR_cooperative_matrix) passed its probe there.
  EXPECT_TRUE(info.coopmat_khr);
}

// The KHR spelling needs what it is built on: cooperative matrix 2's conversions and the fragment
// layout the probes check (never taken on lavapipe, nor with KVTIER_VK_COOPMAT=0 or 1).
TEST(AttentionPathTest, KhrSpellingOnlyOnTopOfCoopmat2AndItsProbe) {
  const DeviceInfo& info = gpu().info();
  if (info.coopmat_khr) {
    EXPECT_TRUE(info.coopmat2);
    EXPECT_TRUE(info.coopmat_mma_fragments);
  }
  if (!info.coopmat2) {
    EXPECT_FALSE(info.coopmat_khr);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionTriangleTest,
    ::testing::Values(
        AttnCase{"bf16_d128_gqa4_b16", DType::kBF16, 128, 4, 2, 16, {1, 16, 100, 1100}},
        AttnCase{"f16_d64_mha_b32", DType::kF16, 64, 1, 2, 32, {1, 32, 33, 700}},
        AttnCase{"f32_d128_gqa8_b16", DType::kF32, 128, 8, 1, 16, {17, 64, 1025}},
        AttnCase{"bf16_d64_gqa4_softcap", DType::kBF16, 64, 4, 2, 16, {50, 600}, 30.0f},
        AttnCase{"f16_d128_gqa4_b32_window", DType::kF16, 128, 4, 2, 32, {200, 1100}, 0.0f, 128},
        AttnCase{"bf16_d128_gqa2_softcap_window", DType::kBF16, 128, 2, 2, 16, {1, 600}, 50.0f, 100},
        // 64-key chunks do not fit shared memory at head_dim 256: the tensor-core kernel takes 32.
        AttnCase{"bf16_d256_gqa2", DType::kBF16, 256, 2, 1, 16, {1, 40, 300}},
        // Blocks of 48 tokens: decode splits (256 tokens) start inside a block and straddle two.
        AttnCase{"bf16_d64_gqa4_b48", DType::kBF16, 64, 4, 1, 48, {1, 300, 700}}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace kvtier
