// HybridGenerator: greedy generation with prefix caching for a hybrid model (Gated DeltaNet
// layers beside attention). A prompt's cached prefix is restorable only up to its last
// block with a state snapshot (HybridPrefixCache::lookup): its KV blocks are fetched into the GPU
// tier, the snapshot is uploaded into the sequence's state slot, and the rest is computed. While
// computing, the state is snapshotted at the prompt's last block end before its last token and
// every `snapshot_every_blocks` blocks, where a 16-token chunk ends, and stored after the KV
// blocks are published (so chain-aware eviction takes a chain's blocks past its last snapshot
// first). Restored prefixes give the bits a computation gives (the contract parity tests hold it
// to): the GDN layers take a prompt's whole aligned chunks in the chunk form and the rest token by
// token (LlamaModel::GdnRows), so only blocks a prompt's chunks filled are published — not those
// decode steps filled, which a prefill of the same text computes in the chunk form.
#pragma once

#include <span>
#include <vector>

#include "generate/cached_generator.h"
#include "cache/hybrid_prefix_cache.h"
#include "engine/model/gdn_state_pool.h"
#include "engine/model/llama_model.h"
#include "tiers/gpu_tier.h"

namespace kvtier {

struct HybridGeneratorOptions {
  size_t snapshot_every_blocks = 0;  // 0: at the ends of prompts and generations only
};

// Not thread-safe (the model's scratch, the state pool); one per thread.
class HybridGenerator {
 public:
  // `states` has a slot for every sequence of a batch.
  HybridGenerator(LlamaModel& model, GpuTier& gpu, GdnStatePool& states, HybridPrefixCache& cache,
                  HybridGeneratorOptions options = {})
      : model_(model), gpu_(gpu), states_(states), cache_(cache), options_(options) {}

  // use_cache = false computes everything and stores nothing (the reference run).
  Result<Generation> generate(std::span<const int32_t> prompt, int max_new_tokens, bool use_cache = true);
  // Each prompt prefilled on its own (its prefix restored where it can be), then all decode
  // together, one batch per step: every sequence's logits are the bits it gets alone.
  Result<std::vector<Generation>> generate_batch(const std::vector<std::vector<int32_t>>& prompts,
                                                 int max_new_tokens, bool use_cache = true);

 private:
  struct Sequence;
  // Restores the longest prefix that ends at a snapshot into `s` (table, state slot); 0 blocks
  // when there is none or it cannot be read (then the slot is fresh).
  Status restore(Sequence& s, bool use_cache);
  // Whether the state after `blocks` full blocks is snapshotted, where `last` is the block count
  // the prompt's (or the generation's) own snapshot is taken at.
  bool snapshot_point(size_t blocks, size_t last) const;
  // Downloads the sequence's state after `blocks` blocks, to be stored with its blocks.
  Status take_snapshot(Sequence& s, size_t blocks);

  LlamaModel& model_;
  GpuTier& gpu_;
  GdnStatePool& states_;
  HybridPrefixCache& cache_;
  HybridGeneratorOptions options_;
};

}  // namespace kvtier
