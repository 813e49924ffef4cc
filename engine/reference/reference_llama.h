// The CPU reference of LlamaModel: the same model and weights in plain loops, one token at a time,
// K and V rounded to the KV cache's dtype exactly as reshape_and_cache stores them. Greedy.
#pragma once

#include <span>
#include <vector>

#include "engine/model/llama_weights.h"

namespace kvtier::reference {

class ReferenceLlama {
 public:
  ReferenceLlama(const LlamaConfig& config, const LlamaWeights& weights, DType kv_dtype)
      : c_(config), w_(weights), kv_dtype_(kv_dtype) {}

  struct Output {
    std::vector<int32_t> tokens;               // generated
    std::vector<std::vector<float>> logits;    // one vector per generated token
  };
  Output generate(std::span<const int32_t> prompt, int max_new_tokens);

 private:
  // Runs one token through the model at `pos`, appending its K/V; returns the final hidden state.
  std::vector<float> step(int32_t token, int pos);
  std::vector<float> logits(const std::vector<float>& hidden) const;

  const LlamaConfig& c_;
  const LlamaWeights& w_;
  DType kv_dtype_;
  std::vector<std::vector<float>> k_, v_;  // per layer: [pos][kv_heads * head_dim]
};

}  // namespace kvtier::reference
