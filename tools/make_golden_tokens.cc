// make_golden_tokens: regenerates tests/engine/golden_tokens.json — the greedy tokens the CPU
// reference of the tiny model produces for the fixed prompts of tests/engine/golden_prompts.h,
// for each KV dtype. Run it only when the model or its weights change on purpose:
//   build/tools/make_golden_tokens > tests/engine/golden_tokens.json
// It also reports the smallest gap between the best and second-best logit at any step: goldens
// are only meaningful where that gap is far larger than the GPU's rounding differences (~1e-4).
#include <algorithm>
#include <iostream>

#include <nlohmann/json.hpp>

#include "engine/reference/reference_llama.h"
#include "tests/engine/golden_prompts.h"

using namespace kvtier;

int main() {
  const LlamaConfig config = LlamaConfig::tiny();
  const LlamaWeights weights = LlamaWeights::synthetic(config);
  nlohmann::json out;
  float min_gap = 1e30f;
  for (DType dt : {DType::kBF16, DType::kF16}) {
    nlohmann::json runs = nlohmann::json::array();
    for (const auto& prompt : testing::golden_prompts()) {
      reference::ReferenceLlama model(config, weights, dt);
      auto g = model.generate(prompt, testing::kGoldenNewTokens);
      for (auto logits : g.logits) {
        std::partial_sort(logits.begin(), logits.begin() + 2, logits.end(), std::greater<float>());
        min_gap = std::min(min_gap, logits[0] - logits[1]);
      }
      runs.push_back(g.tokens);
    }
    out[std::string(dtype_name(dt))] = runs;
  }
  out["min_top2_gap"] = min_gap;
  std::cout << out.dump(2) << "\n";
  std::cerr << "smallest top-1/top-2 logit gap: " << min_gap << "\n";
  return 0;
}
