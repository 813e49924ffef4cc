// How a varlen prefill on tensor cores reads its context and writes its rows: from an f16 copy of
// a bf16 or f32 cache (KvHalfStaging) or converting each chunk, and to f32 or f16 output rows —
// each choice only saves time, so each must give the bits of the other.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "engine/attention/paged_attention.h"
#include "serialize/dtype.h"
#include "tests/engine/engine_test_env.h"
#include "tests/engine/paged_problem.h"

namespace kvtier {
namespace {

using testing::AttnCase;
using testing::from_gpu;
using testing::gpu;
using testing::PagedProblem;
using Path = PagedAttentionVarlen::Path;

// A bf16 or f32 prefill on tensor cores reads its context from an f16 copy (KvHalfStaging): it
// must give the bits of the kernel converting each chunk itself, on every split policy (on the
// H100; lavapipe checks that the scalar path does not stage, and nothing stages an f16 cache).
TEST(AttentionVarlenTest, StagingTheContextAsF16ChangesNoBit) {
  using Policy = PagedAttentionVarlen::SplitPolicy;
  for (DType dtype : {DType::kBF16, DType::kF32, DType::kF16}) {
    // A first chunk of a long prompt after 100 cached tokens, and a whole prompt: both at least
    // four 32-row tiles, so the tensor-core path stages them.
    const AttnCase c{"staged", dtype, 128, 4, 2, 16, {300, 700}};
    PagedProblem s(c, {200, 700});
    for (Path path : testing::compute_paths(s.view, static_cast<uint32_t>(s.num_heads))) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + ", " + PagedAttentionVarlen::path_name(path));
      PagedAttentionVarlen launcher(gpu(), Policy::kAuto, path);
      const bool stages = launcher.stages(s.view, s.batch_view(0));
      EXPECT_EQ(stages, path == Path::kCoopMat && dtype != DType::kF16);
      if (!stages) continue;  // one computation either way
      for (Policy policy : {Policy::kWalkSplits, Policy::kWorkgroupPerSplit}) {
        const auto staged = s.varlen(policy, path, true), converted = s.varlen(policy, path, false);
        EXPECT_EQ(std::memcmp(staged.data(), converted.data(), staged.size() * 4), 0)
            << "policy " << static_cast<int>(policy);
      }
    }
  }
}

// f16 output rows (for a projection on tensor cores) are the f32 rows clamped and rounded as
// to_half rounds them (serialize/dtype.h's f32_to_f16 on the CPU), whether one workgroup walks a
// row's splits or the merge pass joins them; paths that cannot write them refuse.
TEST(AttentionVarlenTest, HalfOutputRowsAreTheF32RowsRounded) {
  using Policy = PagedAttentionVarlen::SplitPolicy;
  PagedProblem s(AttnCase{"half out", DType::kBF16, 64, 4, 2, 16, {300, 700}},
                 {200, 700});  // the 1B's heads
  for (Path path : testing::compute_paths(s.view, static_cast<uint32_t>(s.num_heads))) {
    SCOPED_TRACE(PagedAttentionVarlen::path_name(path));
    PagedAttentionVarlen probe(gpu(), Policy::kAuto, path);
    if (!PagedAttentionVarlen::writes_half(
            probe.path(s.view, static_cast<uint32_t>(s.num_heads)))) {
      GpuBuffer out = testing::gpu_zeros(s.q.size() * 2);
      VarlenBatch b = s.batch_view(out.address());
      b.out_half = true;
      auto batch = std::move(CommandBatch::begin(gpu())).value();
      EXPECT_EQ(probe.record(batch, b, s.view, s.options).code(), StatusCode::kInvalidArgument);
      continue;
    }
    for (Policy policy : {Policy::kWalkSplits, Policy::kWorkgroupPerSplit}) {
      const auto f32 = s.varlen(policy, path);
      GpuBuffer out = testing::gpu_zeros(s.q.size() * 2);
      VarlenBatch b = s.batch_view(out.address());
      b.out_half = true;
      PagedAttentionVarlen launcher(gpu(), policy, path);
      auto batch = std::move(CommandBatch::begin(gpu())).value();
      ASSERT_TRUE(launcher.record(batch, b, s.view, s.options).ok());
      ASSERT_TRUE(batch.submit_and_wait().ok());
      const auto got = from_gpu<uint16_t>(out, s.q.size());
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(got[i], f32_to_f16(std::clamp(f32[i], -65504.0f, 65504.0f)))
            << "value " << i << " (" << f32[i] << "), policy " << static_cast<int>(policy);
      }
    }
  }
}

// Staging only saves time, so a prefill whose staging buffer cannot be had (the device's memory
// full) converts per chunk instead of failing: the same bits, counted. Runs where the tensor-core
// path does (the H100); lavapipe has no cooperative matrices.
TEST(AttentionVarlenTest, AContextThatCannotBeStagedIsConvertedToTheSameBits) {
  using Policy = PagedAttentionVarlen::SplitPolicy;
  PagedProblem s(AttnCase{"staged", DType::kBF16, 128, 4, 2, 16, {300, 700}}, {200, 700});
  const auto paths = testing::compute_paths(s.view, static_cast<uint32_t>(s.num_heads));
  if (std::find(paths.begin(), paths.end(), Path::kCoopMat) == paths.end()) {
    GTEST_SKIP() << "no tensor-core path on " << gpu().info().name;
  }
  const auto converted = s.varlen(Policy::kAuto, Path::kCoopMat, false);
  GpuBuffer out = testing::gpu_zeros(s.q.size() * 4);
  PagedAttentionVarlen launcher(gpu(), Policy::kAuto, Path::kCoopMat);
  ASSERT_TRUE(launcher.stages(s.view, s.batch_view(out.address())));
  auto run = [&]() -> Status {
    KVTIER_ASSIGN_OR_RETURN(CommandBatch batch, CommandBatch::begin(gpu()));
    KVTIER_RETURN_IF_ERROR(launcher.record(batch, s.batch_view(out.address()), s.view, s.options));
    return batch.submit_and_wait();
  };
  // Once unstaged, so the launcher's other scratch buffers exist before the memory runs out.
  launcher.set_half_staging(false);
  ASSERT_TRUE(run().ok());
  launcher.set_half_staging(true);
  std::vector<GpuBuffer> filler;
  bool full = false;
  for (uint64_t size : {1ull << 30, 64ull << 20, 1ull << 20, 64ull << 10}) {
    for (int i = 0; i < 256; ++i) {
      auto b = GpuBuffer::create(gpu(), size, MemoryKind::kDevice);
      if (!b.ok()) {
        full = true;
        break;
      }
      filler.push_back(std::move(b).value());
    }
  }
  if (!full) GTEST_SKIP() << "the device's memory did not run out";
  const Status st = run();
  filler.clear();
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(launcher.staging_fallbacks(), 1u);
  const auto got = from_gpu<float>(out, s.q.size());
  EXPECT_EQ(std::memcmp(got.data(), converted.data(), got.size() * 4), 0);
}

}  // namespace
}  // namespace kvtier
