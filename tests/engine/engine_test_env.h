// The Vulkan device the engine tests share (lavapipe here and in CI; the NVIDIA GPU on the device
// machine), created once per test binary, plus small host <-> GPU helpers.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "engine/attention/paged_attention.h"
#include "engine/vulkan/command_batch.h"
#include "engine/vulkan/gpu_buffer.h"
#include "engine/vulkan/vulkan_context.h"
#include "serialize/kv_layout.h"

namespace kvtier::testing {

inline VulkanContext& gpu() {
  static std::unique_ptr<VulkanContext> ctx = [] {
    auto c = VulkanContext::create();
    if (!c.ok()) {
      ADD_FAILURE() << "no Vulkan device: " << c.status().to_string();
      std::abort();
    }
    return std::move(c).value();
  }();
  return *ctx;
}

template <typename T>
GpuBuffer to_gpu(const std::vector<T>& v) {
  auto b = upload_new<T>(gpu(), std::span<const T>(v));
  EXPECT_TRUE(b.ok()) << b.status().to_string();
  return std::move(b).value();
}

inline GpuBuffer gpu_zeros(uint64_t bytes) {
  std::vector<uint8_t> z(std::max<uint64_t>(bytes, 16), 0);
  return to_gpu(z);
}

template <typename T>
std::vector<T> from_gpu(const GpuBuffer& b, size_t count) {
  std::vector<T> out(count);
  Status st = download(gpu(), b, 0, {reinterpret_cast<uint8_t*>(out.data()), count * sizeof(T)});
  EXPECT_TRUE(st.ok()) << st.to_string();
  return out;
}

inline std::shared_ptr<const KvLayout> share_layout(KvLayout l) {
  return std::make_shared<const KvLayout>(std::move(l));
}

inline std::vector<float> random_floats(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// The compute paths this device runs: the scalar one everywhere, cooperative matrices (tensor
// cores) and cooperative matrices 2 where the device has them — not lavapipe; the H100 through
// the device tool.
inline std::vector<PagedAttentionVarlen::Path> compute_paths() {
  std::vector<PagedAttentionVarlen::Path> paths{PagedAttentionVarlen::Path::kScalar};
  if (gpu().info().coopmat_mma_fragments) paths.push_back(PagedAttentionVarlen::Path::kCoopMat);
  if (gpu().info().coopmat2) paths.push_back(PagedAttentionVarlen::Path::kCoopMat2);
  return paths;
}

// Those of them a cache of this shape can take (a launcher preferring another falls back).
inline std::vector<PagedAttentionVarlen::Path> compute_paths(const PagedKvView& view, uint32_t num_heads) {
  std::vector<PagedAttentionVarlen::Path> out;
  for (auto path : compute_paths()) {
    PagedAttentionVarlen launcher(gpu(), PagedAttentionVarlen::SplitPolicy::kAuto, path);
    if (launcher.path(view, num_heads) == path) out.push_back(path);
  }
  return out;
}

}  // namespace kvtier::testing
