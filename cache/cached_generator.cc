#include "cache/cached_generator.h"

#include <algorithm>
#include <chrono>

namespace kvtier {

namespace {

int32_t argmax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// One sequence's state during generation.
struct Sequence {
  std::vector<int32_t> tokens;    // prompt, then generated
  size_t prompt_len = 0;
  std::vector<int32_t> table;     // GPU block ids, in order
  std::vector<int32_t> owned;     // of those, the ones this request allocated
  PinnedBlocks restored;          // the prefix fetched from the cache, pinned
  Generation out;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int32_t slot_of(const Sequence& s, int pos, int block_size) {
  return s.table[pos / block_size] * block_size + pos % block_size;
}

}  // namespace

Result<Generation> CachedGenerator::generate(std::span<const int32_t> prompt, int max_new_tokens,
                                             bool use_cache) {
  KVTIER_ASSIGN_OR_RETURN(auto all, generate_batch({std::vector<int32_t>(prompt.begin(), prompt.end())},
                                                   max_new_tokens, use_cache));
  return std::move(all.front());
}

Result<std::vector<Generation>> CachedGenerator::generate_batch(
    const std::vector<std::vector<int32_t>>& prompts, int max_new_tokens, bool use_cache,
    bool async_fetch) {
  const int bs = gpu_.pool().layout().block_size;
  if (max_new_tokens < 1) return invalid_argument("generate: max_new_tokens must be at least 1");
  std::vector<Sequence> seqs(prompts.size());
  // Whatever happens, blocks this call allocated go back to the pool.
  struct Releaser {
    GpuTier& gpu;
    std::vector<Sequence>& seqs;
    ~Releaser() {
      for (Sequence& s : seqs) gpu.release(s.owned);
    }
  } releaser{gpu_, seqs};

  // Every sequence's block table is padded to the longest one's, so the decode batch's shape is
  // the same at every step whoever has joined.
  int max_blocks = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    Sequence& s = seqs[i];
    s.tokens = prompts[i];
    s.prompt_len = prompts[i].size();
    if (s.prompt_len == 0) return invalid_argument("generate: empty prompt");
    if (s.prompt_len + max_new_tokens > static_cast<size_t>(model_.config().max_positions)) {
      return invalid_argument("generate: prompt plus new tokens exceed the model's positions");
    }
    max_blocks = std::max(max_blocks, static_cast<int>((s.prompt_len + max_new_tokens + bs - 1) / bs));
  }
  const auto started = std::chrono::steady_clock::now();
  std::vector<std::chrono::steady_clock::time_point> fetch_started(seqs.size());
  std::vector<PendingFetch> pending(seqs.size());
  if (use_cache) {
    for (size_t i = 0; i < seqs.size(); ++i) {
      Sequence& s = seqs[i];
      fetch_started[i] = std::chrono::steady_clock::now();
      const std::vector<uint32_t> tokens(s.tokens.begin(), s.tokens.end());
      auto keys = hasher_.keys(tokens, {});
      // At least one prompt token is computed: its logits choose the first new token.
      keys.resize(std::min(keys.size(), (s.prompt_len - 1) / bs));
      if (async_fetch) {
        pending[i] = cache_.fetch_async(keys);
      } else {
        s.restored = cache_.fetch(keys);
        s.out.restore_seconds = seconds_since(fetch_started[i]);
      }
    }
  }

  // Takes the restored prefix into the sequence's block table, allocates the rest and prefills.
  auto admit = [&](size_t i, size_t step) -> Status {
    Sequence& s = seqs[i];
    if (pending[i].in_background() || pending[i].ready()) s.restored = pending[i].wait();
    size_t restored = 0;
    for (const auto& e : s.restored.entries()) {
      if (!e.pinned || e.device_slot < 0) break;
      s.table.push_back(e.device_slot);
      s.out.restored_blocks_by_tier[e.source_tier]++;
      ++restored;
    }
    s.out.cached_tokens = restored * bs;
    if (async_fetch && use_cache) s.out.restore_seconds = seconds_since(fetch_started[i]);
    s.out.joined_at_step = step;
    const int total_blocks = static_cast<int>((s.prompt_len + max_new_tokens + bs - 1) / bs);
    KVTIER_ASSIGN_OR_RETURN(s.owned, gpu_.allocate(static_cast<uint32_t>(total_blocks - restored)));
    s.table.insert(s.table.end(), s.owned.begin(), s.owned.end());

    const auto t0 = std::chrono::steady_clock::now();
    ForwardBatch b;
    for (size_t pos = s.out.cached_tokens; pos < s.prompt_len; ++pos) {
      b.tokens.push_back(s.tokens[pos]);
      b.positions.push_back(static_cast<int32_t>(pos));
      b.slot_mapping.push_back(slot_of(s, static_cast<int>(pos), bs));
    }
    const int32_t rows = static_cast<int32_t>(b.tokens.size());
    b.cu_seqlens_q = {0, rows};
    b.seq_lens = {static_cast<int32_t>(s.prompt_len)};
    b.block_tables = s.table;
    b.max_blocks_per_seq = static_cast<int32_t>(s.table.size());
    b.logit_rows = {rows - 1};
    KVTIER_ASSIGN_OR_RETURN(std::vector<float> logits, model_.forward(b, gpu_.pool()));
    s.out.tokens.push_back(argmax(logits));
    s.out.logits.push_back(std::move(logits));
    s.out.prefill_seconds = seconds_since(t0);
    s.out.first_token_seconds = seconds_since(started);
    return ok_status();
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

  // Publish every full block whose K/V this call computed (the prompt's and the generated ones').
  if (use_cache) {
    for (Sequence& s : seqs) {
      const size_t computed = s.prompt_len + max_new_tokens - 1;  // the last token has no K/V yet
      const std::vector<uint32_t> tokens(s.tokens.begin(), s.tokens.begin() + computed);
      auto keys = hasher_.keys(tokens, {});
      for (size_t i = s.out.cached_tokens / bs; i < keys.size(); ++i) {
        (void)gpu_.publish(s.table[i], hasher_.identity(keys, i, {}));
      }
    }
  }
  std::vector<Generation> out;
  for (Sequence& s : seqs) out.push_back(std::move(s.out));
  return out;
}

}  // namespace kvtier
