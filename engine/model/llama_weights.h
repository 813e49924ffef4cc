// A small Llama-style decoder's configuration and weights: RMSNorm, RoPE, grouped-query attention,
// SwiGLU MLP, tied embeddings. The weights are synthetic and deterministic (a counter-based
// generator, not std::*_distribution, whose output may change between library versions), so
// golden tokens stay valid. This model exists to exercise the cache end to end, not to be fast.
#pragma once

#include <cstdint>
#include <vector>

#include "serialize/hybrid_layout.h"
#include "serialize/kv_layout.h"

namespace kvtier {

struct LlamaConfig {
  int vocab = 512;
  int num_layers = 4;
  int num_heads = 8;
  int num_kv_heads = 2;
  int head_dim = 64;
  int ffn = 1024;
  float rope_theta = 10000.0f;
  float rms_eps = 1e-5f;
  int max_positions = 4096;
  uint64_t seed = 1;

  // A hybrid model: each layer's kind, in order; empty: every layer is attention.
  // Gated DeltaNet layers take `gdn` (conv_channels = heads * (2 d_k + d_v): q, k and v convolved).
  std::vector<LayerKind> pattern;
  GdnSpec gdn;

  int hidden() const { return num_heads * head_dim; }
  bool is_gdn(int layer) const { return !pattern.empty() && pattern[layer] == LayerKind::kGatedDeltaNet; }
  int gdn_layers() const;
  int attention_layers() const { return num_layers - gdn_layers(); }
  // The KV layout this model produces (its attention layers), every layer in `dtype`.
  KvLayout kv_layout(DType dtype, int block_size) const;
  // For a hybrid model: the whole cache's shape (KV layout, GDN state and window).
  Result<HybridLayout> hybrid_layout(DType dtype, int block_size) const;
  // 4 layers, 8 heads / 2 KV heads, head_dim 64, vocab 512 (the tests' model).
  static LlamaConfig tiny();
  // Llama-3.2-1B's shape (16 layers, 32 heads / 8 KV heads, head_dim 64, FFN 8192) with a 32k
  // vocabulary instead of 128k (the logits are one row per sequence; the rest is the same work):
  // a model whose prefill and KV restore are of the same order on an H100, where planning a hit
  // matters. Weights are generated like the tiny one's.
  static LlamaConfig llama_1b_shaped();
  // The Qwen3.5 pattern scaled down: 8 layers, three Gated DeltaNet layers before each attention
  // layer (4 heads, d_k = d_v = 64, conv width 4), otherwise tiny()'s shape.
  static LlamaConfig tiny_hybrid();
};

// Host copies, f32, row-major; matrices are [in, out] (y = x @ W).
struct LlamaWeights {
  struct Layer {
    std::vector<float> attn_norm, wq, wk, wv, wo, mlp_norm, w_gate, w_up, w_down;
    // Gated DeltaNet layers instead of wq..wo: the q|k|v projection [hidden, conv_channels], the
    // conv's weights [conv_channels, width], the a|b gate projection [hidden, 2 heads], A_log and
    // dt_bias [heads], the output projection [heads * d_v, hidden].
    std::vector<float> w_qkv, conv_w, w_ab, a_log, dt_bias, w_out;
  };
  std::vector<float> embedding;    // [vocab, hidden]
  std::vector<float> embedding_t;  // [hidden, vocab]: logits = h @ embedding^T (tied)
  std::vector<Layer> layers;
  std::vector<float> final_norm;
  std::vector<float> rope_cos, rope_sin;  // [max_positions, head_dim / 2]

  static LlamaWeights synthetic(const LlamaConfig& c);
};

}  // namespace kvtier
