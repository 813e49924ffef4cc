// CachedGenerator: greedy generation with prefix caching, where the data path closes. For each
// prompt it looks up the longest cached prefix (leaving at least one token to compute, which
// yields the first logits), fetches it into GPU blocks from whichever tier holds it (optionally in
// the background, admitting the sequence when its blocks are in), computes only the rest (varlen
// prefill), decodes, and publishes every full block it computed. A restored
// prefix must give the same logits, bit for bit, as computing it — the contract parity tests hold
// it to.
#pragma once

#include <array>
#include <span>
#include <vector>

#include "cache/prefix_hasher.h"
#include "cache/tiered_cache.h"
#include "engine/model/llama_model.h"
#include "tiers/gpu_tier.h"

namespace kvtier {

struct Generation {
  std::vector<int32_t> tokens;             // generated, greedy
  std::vector<std::vector<float>> logits;  // the logits each generated token was chosen from
  size_t cached_tokens = 0;                // prompt tokens restored instead of computed
  std::array<size_t, kMaxTiers> restored_blocks_by_tier{};
  double restore_seconds = 0;  // hashing, lookup and fetch of the cached prefix (with an
                               // asynchronous fetch: until the sequence joined the batch)
  size_t joined_at_step = 0;   // decode steps the batch had run when this sequence was prefilled
  double prefill_seconds = 0;  // computing the rest of the prompt, up to the first token's logits
  double first_token_seconds = 0;  // from the call's start to this sequence's first token
};

// Not thread-safe (the model's scratch buffers); one per thread.
class CachedGenerator {
 public:
  CachedGenerator(LlamaModel& model, GpuTier& gpu, TieredCache& cache, PrefixHasher hasher)
      : model_(model), gpu_(gpu), cache_(cache), hasher_(std::move(hasher)) {}

  // use_cache = false computes everything and publishes nothing (the reference run).
  Result<Generation> generate(std::span<const int32_t> prompt, int max_new_tokens, bool use_cache = true);
  // Each prompt is prefilled on its own, then the sequences decode together, one batch per step,
  // each until it has max_new_tokens. With async_fetch, cached prefixes are fetched with
  // TieredCache::fetch_async: a sequence whose prefix is in memory starts at once, and one whose
  // prefix is loading from the SSD joins the batch at the first step after its blocks are in, while
  // the others keep decoding. Either way every sequence's tokens and logits are the bits it would
  // get alone (rows do not depend on what shares their launch).
  Result<std::vector<Generation>> generate_batch(const std::vector<std::vector<int32_t>>& prompts,
                                                 int max_new_tokens, bool use_cache = true,
                                                 bool async_fetch = false);

 private:
  LlamaModel& model_;
  GpuTier& gpu_;
  TieredCache& cache_;
  PrefixHasher hasher_;
};

}  // namespace kvtier
