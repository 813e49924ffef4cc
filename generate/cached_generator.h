// CachedGenerator: greedy generation with prefix caching, where the data path closes. For each
// prompt it looks up the longest cached prefix (leaving at least one token to compute, which
// yields the first logits), fetches it into GPU blocks from whichever tier holds it (optionally in
// the background, admitting the sequence when its blocks are in), computes only the rest (varlen
// prefill), decodes, and publishes every full block it computed. A restored
// prefix must give the same logits, bit for bit, as computing it — the contract parity tests hold
// it to.
//
// How a cached prefix reaches the GPU is planned per prompt (hit_planner.h): blocks already on the
// GPU are used, and of the rest the first ones may be recomputed while the last ones load, on the
// cost model the cache keeps. A load still not in at its deadline (a multiple of its predicted
// time) is given up and its blocks computed: a hit never waits much longer than a recompute.
#pragma once

#include <array>
#include <chrono>
#include <optional>
#include <span>
#include <vector>

#include "cache/plan/hit_planner.h"
#include "cache/prefix_hasher.h"
#include "cache/prefix_key_memo.h"
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
  // The plan (without async_fetch): cached blocks computed instead of loaded, and whether the
  // load was given up at its deadline (its blocks computed too).
  size_t recomputed_blocks = 0;
  bool load_deadline_passed = false;
  // The plan would have computed every block below the GPU's wherever it lay, so the tiers
  // below were not asked (CachedGenerator::worth_looking_below): computed as uncached.
  bool looked_up_gpu_only = false;
  HitPlan plan;
};

// The checks every generator makes of its batch: at least one new token, no empty prompt, and
// every prompt with its new tokens within the model's positions.
Status check_generation(const std::vector<std::vector<int32_t>>& prompts, int max_new_tokens, int max_positions);

// Gives back the GPU blocks each sequence of a generate call allocated (its `owned` ids) when the
// call ends, however it ends.
template <typename Sequence>
class ReleaseOwnedBlocks {
 public:
  ReleaseOwnedBlocks(GpuTier& gpu, std::vector<Sequence>& seqs) : gpu_(gpu), seqs_(seqs) {}
  ~ReleaseOwnedBlocks() {
    for (Sequence& s : seqs_) gpu_.release(s.owned);
  }
  ReleaseOwnedBlocks(const ReleaseOwnedBlocks&) = delete;
  ReleaseOwnedBlocks& operator=(const ReleaseOwnedBlocks&) = delete;

 private:
  GpuTier& gpu_;
  std::vector<Sequence>& seqs_;
};

struct HitOptions {
  HitPolicy policy = HitPolicy::kCost;
  // Compute exactly this many cached blocks (after those on the GPU, at most all of them),
  // whatever the policy: for parity tests and split sweeps.
  std::optional<size_t> forced_compute_blocks;
  // A load predicted to take t seconds is waited for until max(deadline_factor * t, the predicted
  // recompute) + deadline_slack; then everything after the GPU's blocks is computed. 0: wait
  // however long it takes.
  double deadline_factor = 2.0;
  std::chrono::microseconds deadline_slack{2000};
  // kCost: every probe_after-th plan in a row that computes a tier's blocks loads them instead,
  // to time the tier again (HitPlanInput::probe_after; 0: never). A probe is waited for no longer
  // than the predicted recompute, so at worst it costs that request one recompute more.
  size_t probe_after = 32;
};

// Not thread-safe (the model's scratch buffers); one per thread.
class CachedGenerator {
 public:
  CachedGenerator(LlamaModel& model, GpuTier& gpu, TieredCache& cache, PrefixHasher hasher, HitOptions hit = {})
      : model_(model), gpu_(gpu), cache_(cache), hasher_(std::move(hasher)), hit_(std::move(hit)) {}
  CachedGenerator(const CachedGenerator&) = delete;
  CachedGenerator& operator=(const CachedGenerator&) = delete;

  HitOptions& hit_options() { return hit_; }
  // Times prefills of a synthetic prompt of `tokens` tokens (a short one, its first half, its
  // second half after the first) in blocks of its own, and teaches the cache's cost model what
  // computing costs, so the first request's plan has a prefill estimate. Restore rates are learned
  // from fetches. Publishes nothing.
  Status calibrate(size_t tokens);

  // use_cache = false computes everything and publishes nothing (the reference run).
  Result<Generation> generate(std::span<const int32_t> prompt, int max_new_tokens, bool use_cache = true);
  // Each prompt is prefilled on its own (its hit planned), then the sequences decode together, one
  // batch per step, each until it has max_new_tokens. With async_fetch, cached prefixes are
  // loaded whole (no plan) with
  // TieredCache::fetch_async: a sequence whose prefix is in memory starts at once, and one whose
  // prefix is loading from the SSD joins the batch at the first step after its blocks are in, while
  // the others keep decoding. Either way every sequence's tokens and logits are the bits it would
  // get alone (rows do not depend on what shares their launch).
  Result<std::vector<Generation>> generate_batch(const std::vector<std::vector<int32_t>>& prompts,
                                                 int max_new_tokens, bool use_cache = true,
                                                 bool async_fetch = false);

 private:
  // Tells the cost model what a kCost plan left unloaded, or that it probes (and logs the probe).
  void note_plan(const HitPlan& plan, std::span<const int> block_tiers);
  // Whether the tiers below the GPU are worth asking about a prompt's `blocks` cacheable blocks
  // after the GPU's first `on_gpu`: not where a kCost plan would compute them all even if every
  // one lay in the fastest tier below, trying each lower tier in turn (a probe or a split probe
  // due counts as a load), for then where they lie cannot change the plan. A short prompt of a
  // cheap model (H200 host, tiny, 2048 tokens in RAM or on the SSD): the host's work before the
  // prefill 0.062-0.075 -> 0.035-0.045 ms of a ~0.97 ms first token. A mix of tiers is not
  // tried: with RAM far faster than the SSD it cannot beat both.
  bool worth_looking_below(size_t blocks, size_t on_gpu, uint64_t uncached_tokens) const;
  // The planner's input for cached blocks in `block_tiers` and the tokens after them: this
  // model's block size and bytes, which tiers load beside compute, the probe interval.
  HitPlanInput plan_input(std::span<const int> block_tiers, uint64_t uncached_tokens) const;

  LlamaModel& model_;
  GpuTier& gpu_;
  TieredCache& cache_;
  PrefixHasher hasher_;
  // A request's keys for its hit and, after its first token, for publishing; and the next turn of
  // a conversation (or a prompt sent again) hashes only what it added: SHA-256 of an 8192-token
  // prompt is 0.1 ms of a 3.4 ms tiny-model prefill on the H200 host, on the path to the first
  // token. Refers to hasher_, so the generator does not move.
  PrefixKeyMemo key_memo_{hasher_};
  HitOptions hit_;
  LogThrottle probe_log_, split_probe_log_;
};

}  // namespace kvtier
