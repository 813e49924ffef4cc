// Reading ggml-vulkan's figures from the peer kit's run (bench/harness/ggml_peer.h): the lines
// below are test-backend-ops's perf format with the kit's cases (../shared/device/ggml-peer),
// colour codes and all, among the other lines its run prints.
#include "bench/harness/ggml_peer.h"

#include <gtest/gtest.h>

#include <fstream>

#include "tests/support/temp_dir.h"

namespace kvtier::bench {
namespace {

const char* kRun =
    "== ggml test-backend-ops peer run: backend Vulkan0, filter 'peer=kvtier'\n"
    "ggml_vulkan: 0 = NVIDIA H200 (NVIDIA) | uma: 0 | fp16: 1 | bf16: 1 | warp size: 32 | "
    "matrix cores: NV_coopmat2\n"
    "== perf FLASH_ATTN_EXT\n"
    "  FLASH_ATTN_EXT(hsk=128,hsv=128,nh=8,nr23=[4,1],kv=4096,nb=4096,mask=1,sinks=0,"
    "max_bias=0.000000,logit_softcap=0.000000,prec=f32,type_K=f16,type_V=f16,permute=[0,1,2,3],"
    "mask_pattern=causal,peer=kvtier):        1175 runs -   853.07 us/run - 137.44 GFLOP/run - "
    "\x1b[1;34m161.11 TFLOPS\x1b[0m\n"
    "  FLASH_ATTN_EXT(hsk=128,hsv=128,nh=8,nr23=[4,1],kv=4096,nb=4096,mask=1,sinks=0,"
    "max_bias=0.000000,logit_softcap=0.000000,prec=def,type_K=f16,type_V=f16,permute=[0,1,2,3],"
    "mask_pattern=causal,peer=kvtier):        1175 runs -   871.20 us/run - 137.44 GFLOP/run - "
    "\x1b[1;34m157.76 TFLOPS\x1b[0m\n"
    "  FLASH_ATTN_EXT(hsk=128,hsv=128,nh=8,nr23=[4,1],kv=4096,nb=4096,mask=1,sinks=0,"
    "max_bias=0.000000,logit_softcap=0.000000,prec=f32,type_K=f16,type_V=f16,permute=[0,1,2,3],"
    "mask_pattern=full,peer=kvtier):        600 runs -  1500.00 us/run - 137.44 GFLOP/run - "
    "\x1b[1;34m91.63 TFLOPS\x1b[0m\n"
    "  FLASH_ATTN_EXT(hsk=128,hsv=128,nh=8,nr23=[4,8],kv=8192,nb=1,mask=1,sinks=0,"
    "max_bias=0.000000,logit_softcap=0.000000,prec=f32,type_K=f16,type_V=f16,permute=[0,1,2,3],"
    "mask_pattern=full,peer=kvtier):        5336 runs -   187.50 us/run -   1.07 GFLOP/run - "
    "\x1b[1;34m  5.73 TFLOPS\x1b[0m\n"
    "== perf MUL_MAT\n"
    "  MUL_MAT(type_a=f16,type_b=f32,m=8192,n=8192,k=2048,bs=[1,1],nr=[1,1],per=[0,1,2,3],k_v=0,"
    "o=1,prec=f32,peer=kvtier):          114 runs -  1100.00 us/run - 274.88 GFLOP/run - "
    "\x1b[1;34m249.89 TFLOPS\x1b[0m\n"
    "  MUL_MAT(type_a=f16,type_b=f16,m=8192,n=8192,k=2048,bs=[1,1],nr=[1,1],per=[0,1,2,3],k_v=0,"
    "o=1,prec=f32,peer=kvtier):          120 runs -  1086.50 us/run - 274.88 GFLOP/run - "
    "\x1b[1;34m253.00 TFLOPS\x1b[0m\n"
    "  MUL_MAT(type_a=f16,type_b=f16,m=8192,n=8192,k=2048,bs=[1,1],nr=[1,1],per=[0,1,2,3],k_v=0,"
    "o=1,prec=def,peer=kvtier):          150 runs -   900.00 us/run - 274.88 GFLOP/run - "
    "\x1b[1;34m305.42 TFLOPS\x1b[0m\n"
    "  MUL_MAT(type_a=bf16,type_b=f32,m=2048,n=8192,k=8192,bs=[1,1],nr=[1,1],per=[0,1,2,3],k_v=0,"
    "o=1,prec=def,peer=kvtier):          100 runs -  1200.00 us/run - 274.88 GFLOP/run - "
    "\x1b[1;34m229.07 TFLOPS\x1b[0m\n"
    "  MUL_MAT(type_a=q4_0,type_b=f32,m=4096,n=1,k=4096,bs=[1,1],nr=[1,1],per=[0,1,2,3],k_v=0,"
    "o=1): not supported\n"
    "  2/2 backends passed\n";

TEST(GgmlPeerTest, ReadsEveryPerfLineAndItsParameters) {
  const GgmlPeer peer = GgmlPeer::parse(kRun);
  ASSERT_EQ(peer.cases().size(), 8u);  // not the "not supported" line, nor the others
  const GgmlPeerCase& first = peer.cases().front();
  EXPECT_EQ(first.op, "FLASH_ATTN_EXT");
  EXPECT_DOUBLE_EQ(first.us_per_run, 853.07);
  EXPECT_EQ(first.integer("kv"), 4096);
  EXPECT_EQ(first.integers("nr23"), (std::vector<int64_t>{4, 1}));
  EXPECT_TRUE(first.has("mask_pattern", "causal"));
  EXPECT_FALSE(first.integer("prec").has_value());  // "f32" is no integer
  EXPECT_TRUE(first.integers("kv").empty());        // nor "4096" a list
  // A line whose time is no number is not a perf line (it once threw out of std::stod).
  const GgmlPeer odd = GgmlPeer::parse("  MUL_MAT(m=1,n=1,k=1):   3 runs -   . us/run\n");
  EXPECT_TRUE(odd.cases().empty());
}

TEST(GgmlPeerTest, MatmulTakesTheFastestF32AccumulatingVariant) {
  const GgmlPeer peer = GgmlPeer::parse(kRun);
  // f16 weights, 8192 rows, 2048 -> 8192: the f16-activation case (1086.5) beats the f32 one; the
  // f16-accumulating one (900) is not our arithmetic and is left out.
  EXPECT_EQ(peer.mul_mat_us(8192, 2048, 8192, "f16"), 1086.5);
  // Only a default-precision case of that shape: it is taken.
  EXPECT_EQ(peer.mul_mat_us(8192, 8192, 2048, "bf16"), 1200.0);
  EXPECT_EQ(peer.mul_mat_us(8192, 8192, 2048, "f16"), std::nullopt);  // no such weights
  EXPECT_EQ(peer.mul_mat_us(4096, 2048, 8192, "f16"), std::nullopt);  // other rows
}

TEST(GgmlPeerTest, AttentionMatchesShapeMaskAndSequences) {
  const GgmlPeer peer = GgmlPeer::parse(kRun);
  EXPECT_EQ(peer.attention_us(128, 8, 4, 4096, 4096, 1, true), 853.07);  // fastest precision
  EXPECT_EQ(peer.attention_us(128, 8, 4, 4096, 4096, 1, false), 1500.0);
  EXPECT_EQ(peer.attention_us(128, 8, 4, 1, 8192, 8, false), 187.5);  // decode, 8 sequences
  EXPECT_EQ(peer.attention_us(128, 8, 4, 1, 8192, 1, false), std::nullopt);
  EXPECT_EQ(peer.attention_us(64, 8, 4, 4096, 4096, 1, true), std::nullopt);
}

TEST(GgmlPeerTest, AFileWithoutPerfLinesIsAnErrorNotEmptyColumns) {
  testing::TempDir dir;
  EXPECT_EQ(GgmlPeer::read((dir / "absent.txt").string()).status().code(), StatusCode::kNotFound);
  { std::ofstream(dir / "wrong.txt") << "Backend 1/2: Vulkan0\n  12/12 tests passed\n"; }
  EXPECT_EQ(GgmlPeer::read((dir / "wrong.txt").string()).status().code(),
            StatusCode::kInvalidArgument);
  { std::ofstream(dir / "run.txt") << kRun; }
  const auto peer = GgmlPeer::read((dir / "run.txt").string());
  ASSERT_TRUE(peer.ok()) << peer.status().to_string();
  EXPECT_EQ(peer->cases().size(), 8u);
}

}  // namespace
}  // namespace kvtier::bench
