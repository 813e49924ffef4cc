#include "generate/cached_generator.h"

#include <algorithm>
#include <chrono>

#include "base/elapsed.h"

namespace kvtier {

namespace {

using Clock = std::chrono::steady_clock;

int32_t argmax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// One sequence's state during generation.
struct Sequence {
  std::vector<int32_t> tokens;    // prompt, then generated
  size_t prompt_len = 0;
  std::vector<int32_t> table;     // GPU block ids, in order
  std::vector<int32_t> owned;     // of those, the ones this request allocated
  std::vector<PinnedBlocks> restored;  // the parts of the prefix fetched from the cache, pinned
  size_t restored_prefix_blocks = 0;   // table entries [0, this) restored, not computed...
  std::vector<bool> restored_block;    // ...and exactly which (a plan computes some in between)
  PendingFetch given_up;               // a load past its deadline, waited for after the first token
  Generation out;
};

int32_t slot_of(const Sequence& s, int pos, int block_size) {
  return s.table[pos / block_size] * block_size + pos % block_size;
}

// Table entries for the pinned blocks of `got`, in order, up to the first one not usable on the GPU.
size_t take_pinned(Sequence& s, PinnedBlocks got) {
  size_t n = 0;
  for (const auto& e : got.entries()) {
    if (!e.pinned || e.device_slot < 0) break;
    s.table.push_back(e.device_slot);
    s.restored_block.push_back(true);
    s.out.restored_blocks_by_tier[e.source_tier]++;
    ++n;
  }
  s.restored.push_back(std::move(got));
  return n;
}

}  // namespace

Status check_generation(const std::vector<std::vector<int32_t>>& prompts, int max_new_tokens, int max_positions) {
  if (max_new_tokens < 1) return invalid_argument("generate: max_new_tokens must be at least 1");
  for (const auto& p : prompts) {
    if (p.empty()) return invalid_argument("generate: empty prompt");
    if (p.size() + max_new_tokens > static_cast<size_t>(max_positions)) {
      return invalid_argument("generate: prompt plus new tokens exceed the model's positions");
    }
  }
  return ok_status();
}

Status CachedGenerator::calibrate(size_t tokens) {
  const int bs = gpu_.pool().layout().block_size;
  tokens = std::max<size_t>(4 * bs, std::min<size_t>(tokens, model_.config().max_positions));
  const size_t blocks = (tokens + bs - 1) / bs;
  KVTIER_ASSIGN_OR_RETURN(std::vector<int32_t> table, gpu_.allocate(static_cast<uint32_t>(blocks)));
  struct Release {
    GpuTier& gpu;
    std::vector<int32_t>& ids;
    ~Release() { gpu.release(ids); }
  } release{gpu_, table};
  auto run = [&](size_t from, size_t to, bool observe) -> Status {
    ForwardBatch b;
    for (size_t pos = from; pos < to; ++pos) {
      b.tokens.push_back(static_cast<int32_t>((pos * 7919) % model_.config().vocab));
      b.positions.push_back(static_cast<int32_t>(pos));
      b.slot_mapping.push_back(table[pos / bs] * bs + static_cast<int32_t>(pos % bs));
    }
    b.cu_seqlens_q = {0, static_cast<int32_t>(to - from)};
    b.seq_lens = {static_cast<int32_t>(to)};
    b.block_tables = table;
    b.max_blocks_per_seq = static_cast<int32_t>(table.size());
    b.logit_rows = {static_cast<int32_t>(to - from) - 1};
    const auto t0 = Clock::now();
    KVTIER_RETURN_IF_ERROR(model_.forward(b, gpu_.pool()).status());
    if (observe) cache_.costs().observe_prefill(to - from, from, seconds_since(t0));
    return ok_status();
  };
  const size_t half = tokens / 2, short_run = std::min<size_t>(4 * bs, half);
  // Pipelines compiled and scratch grown for the whole length, untimed: the first forward of a
  // length builds what it needs, and timed it teaches the cost model a prefill several times the
  // real one (hit_cost_model.h).
  KVTIER_RETURN_IF_ERROR(run(0, tokens, false));
  for (int round = 0; round < 2; ++round) {
    KVTIER_RETURN_IF_ERROR(run(0, short_run, true));
    KVTIER_RETURN_IF_ERROR(run(0, half, true));
    KVTIER_RETURN_IF_ERROR(run(half, tokens, true));
  }
  return ok_status();
}

Result<Generation> CachedGenerator::generate(std::span<const int32_t> prompt, int max_new_tokens,
                                             bool use_cache) {
  KVTIER_ASSIGN_OR_RETURN(auto all, generate_batch({std::vector<int32_t>(prompt.begin(), prompt.end())},
                                                   max_new_tokens, use_cache));
  return std::move(all.front());
}

HitPlanInput CachedGenerator::plan_input(std::span<const int> block_tiers,
                                         uint64_t uncached_tokens) const {
  HitPlanInput input{block_tiers,
                     gpu_.pool().layout().dense_block_bytes(),
                     static_cast<uint32_t>(gpu_.pool().layout().block_size),
                     uncached_tokens,
                     {}};
  const auto& tiers = cache_.tiers();
  for (size_t t = 0; t < tiers.size() && t < kMaxTiers; ++t) {
    input.overlaps_compute[t] = tiers[t]->reads_wait_on_io();
  }
  input.probe_after = hit_.forced_compute_blocks ? 0 : hit_.probe_after;
  return input;
}

bool CachedGenerator::worth_looking_below(size_t blocks, size_t on_gpu,
                                          uint64_t uncached_tokens) const {
  if (hit_.policy != HitPolicy::kCost || hit_.forced_compute_blocks) return true;
  std::vector<int> where(blocks, 0);
  const HitPlanInput input = plan_input(where, uncached_tokens);
  const HitCostModel::Snapshot costs = cache_.costs().snapshot();
  for (size_t t = 1; t < cache_.tiers().size() && t < kMaxTiers; ++t) {
    std::fill(where.begin() + static_cast<std::ptrdiff_t>(on_gpu), where.end(),
              static_cast<int>(t));
    const HitPlan p = plan_hit(input, costs, HitPolicy::kCost);
    if (p.compute_blocks < blocks || p.probe || p.split_probe || p.split_passed_over ||
        !p.load_only || !p.compute_only) {
      return true;
    }
  }
  return false;
}

void CachedGenerator::note_plan(const HitPlan& plan, std::span<const int> block_tiers) {
  if (hit_.policy != HitPolicy::kCost) return;
  HitCostModel& costs = cache_.costs();
  record_plan(costs, plan, block_tiers);
  if (plan.split_probe) {
    split_probe_log_.info(
        "hit plan: computing {} of {} cached blocks while the rest load, to time the overlap "
        "again: the "
        "overlap factor {:.2f} had ruled such splits out",
        plan.compute_blocks - plan.gpu_blocks, plan.cached_blocks - plan.gpu_blocks,
        costs.overlap_factor());
  }
  if (plan.probe) {
    const auto& tiers = cache_.tiers();
    probe_log_.info(
        "hit plan: loading {} cached blocks to time the {} tier again, although computing them was "
        "predicted to win ({:.3f} ms against {:.3f}): plans kept computing its blocks, or its last "
        "restore came in far under its estimate",
        plan.cached_blocks - plan.gpu_blocks,
        plan.probe_tier < tiers.size() ? tiers[plan.probe_tier]->name() : std::string_view("?"),
        plan.load_only.value_or(0) * 1e3, plan.compute_only.value_or(0) * 1e3);
  }
}

Result<std::vector<Generation>> CachedGenerator::generate_batch(
    const std::vector<std::vector<int32_t>>& prompts, int max_new_tokens, bool use_cache,
    bool async_fetch) {
  const int bs = gpu_.pool().layout().block_size;
  KVTIER_RETURN_IF_ERROR(check_generation(prompts, max_new_tokens, model_.config().max_positions));
  std::vector<Sequence> seqs(prompts.size());
  const ReleaseOwnedBlocks<Sequence> releaser(gpu_, seqs);

  // Every sequence's block table is padded to the longest one's, so the decode batch's shape is
  // the same at every step whoever has joined.
  int max_blocks = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    Sequence& s = seqs[i];
    s.tokens = prompts[i];
    s.prompt_len = prompts[i].size();
    max_blocks = std::max(max_blocks, static_cast<int>((s.prompt_len + max_new_tokens + bs - 1) / bs));
  }
  const auto started = Clock::now();
  // The prompt's full blocks that may come from the cache: at least one prompt token is computed,
  // for the logits that choose the first new token.
  // The keys point into `tokens`, which must outlive them.
  auto cacheable_keys = [&](const Sequence& s, std::vector<uint32_t>& tokens) {
    tokens.assign(s.tokens.begin(), s.tokens.end());
    auto keys = key_memo_.keys(tokens, {});
    keys.resize(std::min(keys.size(), (s.prompt_len - 1) / bs));
    return keys;
  };
  std::vector<Clock::time_point> fetch_started(seqs.size());
  std::vector<PendingFetch> pending(seqs.size());
  if (use_cache && async_fetch) {
    for (size_t i = 0; i < seqs.size(); ++i) {
      fetch_started[i] = Clock::now();
      std::vector<uint32_t> tokens;
      pending[i] = cache_.fetch_async(cacheable_keys(seqs[i], tokens));  // copies the keys and tokens
    }
  }

  // Allocates the sequence's blocks from table entry `from` on, to the end of its generation.
  auto allocate_rest = [&](Sequence& s) -> Status {
    const size_t total = (s.prompt_len + max_new_tokens + bs - 1) / bs;
    if (s.table.size() >= total) return ok_status();
    KVTIER_ASSIGN_OR_RETURN(auto ids, gpu_.allocate(static_cast<uint32_t>(total - s.table.size())));
    s.table.insert(s.table.end(), ids.begin(), ids.end());
    s.owned.insert(s.owned.end(), ids.begin(), ids.end());
    s.restored_block.resize(s.table.size(), false);
    return ok_status();
  };
  // Computes prompt rows [from, to) over the sequence's table (which must reach `to`); the last
  // row's logits land in `logits`. Each prefill teaches the cost model what computing costs here.
  auto prefill = [&](Sequence& s, size_t from, size_t to, std::vector<float>& logits, bool timed = true) -> Status {
    const auto t0 = Clock::now();
    ForwardBatch b;
    for (size_t pos = from; pos < to; ++pos) {
      b.tokens.push_back(s.tokens[pos]);
      b.positions.push_back(static_cast<int32_t>(pos));
      b.slot_mapping.push_back(slot_of(s, static_cast<int>(pos), bs));
    }
    const int32_t rows = static_cast<int32_t>(b.tokens.size());
    b.cu_seqlens_q = {0, rows};
    b.seq_lens = {static_cast<int32_t>(to)};
    b.block_tables = s.table;
    b.max_blocks_per_seq = static_cast<int32_t>(s.table.size());
    b.logit_rows = {rows - 1};
    KVTIER_ASSIGN_OR_RETURN(logits, model_.forward(b, gpu_.pool()));
    if (timed) cache_.costs().observe_prefill(to - from, from, seconds_since(t0));
    return ok_status();
  };
  auto first_token = [&](Sequence& s, std::vector<float> logits, Clock::time_point t0) {
    s.out.tokens.push_back(argmax(logits));
    s.out.logits.push_back(std::move(logits));
    s.out.prefill_seconds = seconds_since(t0);
    s.out.first_token_seconds = seconds_since(started);
  };

  // A prefix fetched whole in the background (async_fetch): its blocks, then the rest computed.
  auto admit_loaded = [&](size_t i, size_t step) -> Status {
    Sequence& s = seqs[i];
    if (pending[i].in_background() || pending[i].ready()) s.restored_prefix_blocks = take_pinned(s, pending[i].wait());
    s.out.cached_tokens = s.restored_prefix_blocks * bs;
    if (use_cache) s.out.restore_seconds = seconds_since(fetch_started[i]);
    s.out.joined_at_step = step;
    KVTIER_RETURN_IF_ERROR(allocate_rest(s));
    const auto t0 = Clock::now();
    std::vector<float> logits;
    KVTIER_RETURN_IF_ERROR(prefill(s, s.out.cached_tokens, s.prompt_len, logits));
    first_token(s, std::move(logits), t0);
    return ok_status();
  };

  // A planned hit: blocks on the GPU used in place; blocks [g, split) computed while [split, n)
  // load on a loader thread; what did not load by the deadline computed with the uncached rest.
  auto admit_planned = [&](size_t i, size_t step) -> Status {
    Sequence& s = seqs[i];
    s.out.joined_at_step = step;
    const auto t_start = Clock::now();
    std::vector<uint32_t> tokens;
    const auto keys = cacheable_keys(s, tokens);
    // The blocks on the GPU are pinned as the lookup finds them: used in place whatever the plan.
    const uint64_t after_keys = s.prompt_len - keys.size() * bs;
    auto [found, on_gpu, gpu_only] = cache_.lookup_pinning_top(
        keys, [&](size_t g) { return worth_looking_below(keys.size(), g, after_keys); });
    s.out.looked_up_gpu_only = gpu_only;
    if (gpu_only) {
      // Counted as a plan that computed that tier's blocks (the first block's tier stands for
      // the rest), so a probe still comes round to time it again (HitPlanInput::probe_after).
      const size_t g = found.blocks.size();
      const int t = g < keys.size() ? cache_.tier_holding(keys[g].hash) : -1;
      if (t > 0) cache_.costs().note_unloaded(static_cast<size_t>(t));
    }
    std::vector<int> tiers;
    for (const auto& h : found.blocks) tiers.push_back(h.tier);
    const size_t n = tiers.size();
    s.out.plan = plan_hit(plan_input(tiers, s.prompt_len - n * bs), cache_.costs(), hit_.policy);
    size_t split = s.out.plan.compute_blocks;
    if (hit_.forced_compute_blocks) {
      split = std::min(n, s.out.plan.gpu_blocks + *hit_.forced_compute_blocks);
    } else {
      note_plan(s.out.plan, tiers);
    }
    // Blocks on the GPU: pinned in place, no transfer. One the lookup found there but could not
    // pin (on its way out) moves the split's start back (it is computed or loaded with the rest).
    const size_t g = take_pinned(s, std::move(on_gpu));
    split = std::max(split, g);
    PendingFetch back;
    const auto load_started = Clock::now();
    // A load beside a front computed meanwhile shares the GPU with it: its time would teach the
    // cost model the compute's, so only a pure load is timed (and a front beside a load likewise).
    const bool overlapped = split > g && split < n;
    if (split < n) {
      back = cache_.fetch_async(std::span(keys).subspan(split, n - split),
                                FetchThread::kAlways, overlapped ? FetchTiming::kUntimed : FetchTiming::kTimed);
    }
    // The front, computed while the back loads. Computing every cached block is one prefill with
    // the uncached rest (below): a second launch costs more than it saves.
    std::vector<float> logits;
    if (split > g && split < n) {
      KVTIER_ASSIGN_OR_RETURN(auto ids, gpu_.allocate(static_cast<uint32_t>(split - g)));
      s.table.insert(s.table.end(), ids.begin(), ids.end());
      s.owned.insert(s.owned.end(), ids.begin(), ids.end());
      s.restored_block.resize(s.table.size(), false);
      KVTIER_RETURN_IF_ERROR(prefill(s, g * bs, split * bs, logits, /*timed=*/false));
    }
    size_t loaded = 0;
    if (split < n) {
      // Giving up costs a recompute from the GPU's blocks (one launch, for exactness), so the load
      // is given until a recompute would have finished, and at least deadline_factor times its own
      // prediction: a load a little late is still cheaper than starting over.
      // A probe's load was predicted to lose: it is given only until a recompute would have
      // finished.
      auto deadline = Clock::time_point::max();
      if (hit_.deadline_factor > 0 && s.out.plan.load_seconds) {
        const double wait = s.out.plan.probe && s.out.plan.compute_only
                                ? *s.out.plan.compute_only
                                : std::max(hit_.deadline_factor * *s.out.plan.load_seconds,
                                           s.out.plan.compute_only.value_or(0.0));
        deadline = load_started + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(wait)) +
                   hit_.deadline_slack;
      }
      const bool in_time = back.wait_until(deadline);
      // The plan's own split, front and load side by side: how much slower than each alone (the
      // cost model's overlap factor); one given up at its deadline was at least this slow. Splits
      // forced by a benchmark teach nothing.
      if (overlapped && split == s.out.plan.compute_blocks && s.out.plan.overlap_alone) {
        cache_.costs().observe_overlap(*s.out.plan.overlap_alone, seconds_since(load_started));
      }
      if (in_time) {
        loaded = take_pinned(s, back.wait());
      } else {
        // Given up: its blocks are computed below. The load still finishes (and unpins what it
        // brought); this call waits for it after the first token, so no load of this call's
        // outlives it.
        s.out.load_deadline_passed = true;
        s.given_up = std::move(back);
      }
    }
    // A load given up at its deadline: the front is computed again with everything after it, in
    // one launch from the GPU's blocks. On the H100's tensor-core path, rows computed in a second
    // launch after a computed front did not give the one-launch bits (every split at 8k and 32k
    // tokens, e2e_bench --sweep-deadline), while a front, a loaded middle and the rest did: the
    // parity contract outranks the front's time.
    const size_t present = split < n && !s.out.load_deadline_passed ? split + loaded : g;
    s.out.cached_tokens = (g + loaded) * bs;
    s.out.recomputed_blocks = n - g - loaded;  // the front counted once, though computed twice on a deadline
    s.out.restore_seconds = seconds_since(t_start);
    KVTIER_RETURN_IF_ERROR(allocate_rest(s));
    const auto t0 = Clock::now();
    KVTIER_RETURN_IF_ERROR(prefill(s, present * bs, s.prompt_len, logits));
    first_token(s, std::move(logits), t0);
    return ok_status();
  };
  auto admit = [&](size_t i, size_t step) {
    return use_cache && !async_fetch ? admit_planned(i, step) : admit_loaded(i, step);
  };

  std::vector<bool> joined(seqs.size(), false);
  size_t waiting = seqs.size();
  for (size_t step = 0;; ++step) {
    // Admit every sequence whose prefix is in; with nothing to decode meanwhile, wait for one.
    bool any_active = false;
    for (size_t i = 0; i < seqs.size(); ++i) {
      any_active = any_active || (joined[i] && seqs[i].out.tokens.size() < static_cast<size_t>(max_new_tokens));
    }
    for (const bool wait : {false, true}) {
      for (size_t i = 0; i < seqs.size(); ++i) {
        if (joined[i]) continue;
        const bool in = !pending[i].in_background() || pending[i].ready();
        // First every sequence whose blocks are in; then, only if none can decode meanwhile, wait
        // for the first one still loading.
        if (!in && (!wait || any_active)) continue;
        KVTIER_RETURN_IF_ERROR(admit(i, step));
        joined[i] = true;
        --waiting;
        any_active = any_active || max_new_tokens > 1;
      }
    }
    // One decode step for every sequence that has joined and is not done.
    ForwardBatch b;
    b.cu_seqlens_q.push_back(0);
    b.max_blocks_per_seq = max_blocks;
    std::vector<size_t> rows;
    for (size_t i = 0; i < seqs.size(); ++i) {
      Sequence& s = seqs[i];
      if (!joined[i] || s.out.tokens.size() >= static_cast<size_t>(max_new_tokens)) continue;
      const int pos = static_cast<int>(s.prompt_len + s.out.tokens.size()) - 1;  // the last generated token's
      s.tokens.push_back(s.out.tokens.back());
      b.tokens.push_back(s.tokens[pos]);
      b.positions.push_back(pos);
      b.slot_mapping.push_back(slot_of(s, pos, bs));
      b.cu_seqlens_q.push_back(b.cu_seqlens_q.back() + 1);
      b.seq_lens.push_back(pos + 1);
      std::vector<int32_t> row = s.table;
      row.resize(max_blocks, 0);
      b.block_tables.insert(b.block_tables.end(), row.begin(), row.end());
      b.logit_rows.push_back(static_cast<int32_t>(b.logit_rows.size()));
      rows.push_back(i);
    }
    if (rows.empty()) {
      if (waiting == 0) break;
      continue;  // every joined sequence is done; the next pass waits for a pending prefix
    }
    KVTIER_ASSIGN_OR_RETURN(std::vector<float> logits, model_.forward(b, gpu_.pool()));
    const size_t vocab = model_.config().vocab;
    for (size_t r = 0; r < rows.size(); ++r) {
      std::vector<float> mine(logits.begin() + r * vocab, logits.begin() + (r + 1) * vocab);
      seqs[rows[r]].out.tokens.push_back(argmax(mine));
      seqs[rows[r]].out.logits.push_back(std::move(mine));
    }
  }

  for (Sequence& s : seqs) {
    if (s.given_up.in_background()) s.given_up.wait().release();
  }
  // Publish every full block whose K/V this call computed (the prompt's and the generated ones').
  if (use_cache) {
    for (Sequence& s : seqs) {
      const size_t computed = s.prompt_len + max_new_tokens - 1;  // the last token has no K/V yet
      const std::vector<uint32_t> tokens(s.tokens.begin(), s.tokens.begin() + computed);
      auto keys = key_memo_.keys(tokens, {});
      for (size_t i = 0; i < keys.size(); ++i) {
        if (i < s.restored_block.size() && s.restored_block[i]) continue;
        (void)gpu_.publish(s.table[i], hasher_.identity(keys, i, {}));
      }
    }
  }
  std::vector<Generation> out;
  for (Sequence& s : seqs) out.push_back(std::move(s.out));
  return out;
}

}  // namespace kvtier
