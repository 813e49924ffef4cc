#include "engine/model/llama_weights.h"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

namespace kvtier {

int LlamaConfig::gdn_layers() const {
  return static_cast<int>(std::count(pattern.begin(), pattern.end(), LayerKind::kGatedDeltaNet));
}

KvLayout LlamaConfig::kv_layout(DType dtype, int block_size) const {
  const int layers = attention_layers();
  return KvLayout::uniform("llama-l" + std::to_string(layers) + "-h" + std::to_string(num_kv_heads) +
                               "-d" + std::to_string(head_dim),
                           layers, num_kv_heads, head_dim, block_size, dtype);
}

Result<HybridLayout> LlamaConfig::hybrid_layout(DType dtype, int block_size) const {
  nlohmann::json kinds = nlohmann::json::array();
  for (LayerKind k : pattern) kinds.push_back(k == LayerKind::kAttention ? "attention" : "gdn");
  nlohmann::json j = {{"name", "hybrid-l" + std::to_string(num_layers) + "-g" + std::to_string(gdn_layers())},
                      {"block_size", block_size},
                      {"dtype", std::string(dtype_name(dtype))},
                      {"attention", {{"num_kv_heads", num_kv_heads}, {"head_dim", head_dim}}},
                      {"pattern", kinds}};
  if (gdn_layers() > 0) {
    j["gdn"] = {{"heads", gdn.heads}, {"d_k", gdn.d_k}, {"d_v", gdn.d_v}, {"conv_width", gdn.conv_width},
                {"conv_channels", gdn.conv_channels}};
  }
  return HybridLayout::from_json(j);
}

LlamaConfig LlamaConfig::tiny() { return LlamaConfig{}; }

LlamaConfig LlamaConfig::tiny_hybrid() {
  LlamaConfig c;
  c.num_layers = 8;
  using K = LayerKind;
  c.pattern = {K::kGatedDeltaNet, K::kGatedDeltaNet, K::kGatedDeltaNet, K::kAttention,
               K::kGatedDeltaNet, K::kGatedDeltaNet, K::kGatedDeltaNet, K::kAttention};
  c.gdn = GdnSpec{4, 64, 64, 4, 4 * (64 + 64 + 64)};
  return c;
}

LlamaConfig LlamaConfig::llama_1b_shaped() {
  LlamaConfig c;
  c.vocab = 32768;
  c.num_layers = 16;
  c.num_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 64;
  c.ffn = 8192;
  c.rope_theta = 500000.0f;
  return c;
}

namespace {

// splitmix64: the same numbers on every platform and library version.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [-scale, scale), from (seed, stream, index).
std::vector<float> uniform(uint64_t seed, uint64_t stream, size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t r = mix(seed * 0x100000001b3ull ^ mix(stream << 40 ^ i));
    v[i] = (static_cast<float>(r >> 40) * 0x1p-24f * 2.0f - 1.0f) * scale;
  }
  return v;
}

}  // namespace

LlamaWeights LlamaWeights::synthetic(const LlamaConfig& c) {
  LlamaWeights w;
  const int h = c.hidden(), kvd = c.num_kv_heads * c.head_dim;
  // Uniform(-a, a) with a = sqrt(3 / fan_in) keeps activations near unit scale; a wide
  // embedding gives peaked logits, so greedy choices are far from ties.
  auto mat = [&](uint64_t stream, int in, int out) {
    return uniform(c.seed, stream, static_cast<size_t>(in) * out, std::sqrt(3.0f / in));
  };
  w.embedding = uniform(c.seed, 1, static_cast<size_t>(c.vocab) * h, 1.0f);
  w.embedding_t.resize(w.embedding.size());
  for (int t = 0; t < c.vocab; ++t) {
    for (int d = 0; d < h; ++d) w.embedding_t[static_cast<size_t>(d) * c.vocab + t] = w.embedding[static_cast<size_t>(t) * h + d];
  }
  for (int l = 0; l < c.num_layers; ++l) {
    const uint64_t s = 100 + 16 * static_cast<uint64_t>(l);
    Layer L;
    L.attn_norm = uniform(c.seed, s, h, 0.2f);
    for (float& x : L.attn_norm) x += 1.0f;
    if (c.is_gdn(l)) {
      const GdnSpec& g = c.gdn;
      L.w_qkv = mat(s + 9, h, g.conv_channels);
      L.conv_w = uniform(c.seed, s + 10, static_cast<size_t>(g.conv_channels) * g.conv_width,
                         std::sqrt(3.0f / g.conv_width));
      L.w_ab = mat(s + 11, h, 2 * g.heads);
      // Slow decays (exp(g) close to 1: A in [0.01, 0.1], softplus(-2) ~ 0.13), so a GDN layer's
      // state remembers the whole prompt and a wrong snapshot shows in the logits.
      L.a_log = uniform(c.seed, s + 12, g.heads, 1.0f);
      for (float& x : L.a_log) x = std::log(0.055f + 0.045f * x);
      L.dt_bias.assign(g.heads, -2.0f);
      L.w_out = mat(s + 13, g.heads * g.d_v, h);
      for (float& x : L.w_out) x *= 6.0f;  // as wo, below
    } else {
      L.wq = mat(s + 1, h, h);
      L.wk = mat(s + 2, h, kvd);
      L.wv = mat(s + 3, h, kvd);
      L.wo = mat(s + 4, h, h);
      // Output projections 6x larger than unit-variance: with tied embeddings the residual stream
      // is otherwise the input token's own embedding and greedy decoding just repeats it. At 6x
      // the generations vary and the smallest gap between the two best logits of the golden
      // prompts is 0.47 (tools/make_golden_tokens reports it), thousands of times the GPU-vs-CPU
      // rounding.
      for (float& x : L.wo) x *= 6.0f;
    }
    L.mlp_norm = uniform(c.seed, s + 5, h, 0.2f);
    for (float& x : L.mlp_norm) x += 1.0f;
    L.w_gate = mat(s + 6, h, c.ffn);
    L.w_up = mat(s + 7, h, c.ffn);
    L.w_down = mat(s + 8, c.ffn, h);
    for (float& x : L.w_down) x *= 6.0f;
    w.layers.push_back(std::move(L));
  }
  w.final_norm.assign(h, 1.0f);
  const int half = c.head_dim / 2;
  w.rope_cos.resize(static_cast<size_t>(c.max_positions) * half);
  w.rope_sin.resize(w.rope_cos.size());
  for (int p = 0; p < c.max_positions; ++p) {
    for (int j = 0; j < half; ++j) {
      const double inv_freq = std::pow(static_cast<double>(c.rope_theta), -2.0 * j / c.head_dim);
      w.rope_cos[static_cast<size_t>(p) * half + j] = static_cast<float>(std::cos(p * inv_freq));
      w.rope_sin[static_cast<size_t>(p) * half + j] = static_cast<float>(std::sin(p * inv_freq));
    }
  }
  return w;
}

}  // namespace kvtier
