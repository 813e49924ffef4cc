#include "generate/hybrid_generator.h"

#include <algorithm>
#include <chrono>

#include "base/elapsed.h"

namespace kvtier {

namespace {

using Clock = std::chrono::steady_clock;

int32_t argmax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

}  // namespace

struct HybridGenerator::Sequence {
  std::vector<int32_t> tokens;  // prompt, then generated
  size_t prompt_len = 0;
  int32_t slot = 0;
  std::vector<int32_t> table;  // GPU block ids, in order
  std::vector<int32_t> owned;  // of those, the ones this call allocated
  size_t restored_blocks = 0;  // table entries [0, this) restored
  PinnedBlocks pinned;
  // Snapshots taken while computing (after this many blocks, the bytes), stored once the blocks
  // are published: newer than the blocks past them, which chain-aware eviction then takes first.
  std::vector<std::pair<size_t, std::vector<uint8_t>>> snapshots;
  Generation out;
};

bool HybridGenerator::snapshot_point(size_t blocks, size_t last) const {
  // Only where a chunk of the GDN layers' chunk form ends: a prompt resumed there gives the bits
  // of computing it in one forward (LlamaModel::GdnRows).
  const size_t bs = static_cast<size_t>(cache_.hasher().block_size());
  if (blocks * bs % GatedDeltaRule::kChunk != 0) return false;
  return blocks > 0 && (blocks == last || (options_.snapshot_every_blocks > 0 && blocks % options_.snapshot_every_blocks == 0));
}

Status HybridGenerator::take_snapshot(Sequence& s, size_t blocks) {
  std::vector<uint8_t> bytes(states_.snapshot_bytes());
  KVTIER_RETURN_IF_ERROR(states_.download(static_cast<uint32_t>(s.slot), bytes));
  s.snapshots.emplace_back(blocks, std::move(bytes));
  return ok_status();
}

Status HybridGenerator::restore(Sequence& s, bool use_cache) {
  KVTIER_RETURN_IF_ERROR(states_.reset(static_cast<uint32_t>(s.slot)));
  if (!use_cache) return ok_status();
  const size_t bs = static_cast<size_t>(cache_.hasher().block_size());
  const std::vector<uint32_t> tokens(s.tokens.begin(), s.tokens.begin() + s.prompt_len);
  auto keys = cache_.hasher().keys(tokens, {});
  keys.resize(std::min(keys.size(), (s.prompt_len - 1) / bs));  // at least one token computed
  size_t n = cache_.lookup(keys).blocks;
  if (n == 0) return ok_status();
  s.pinned = cache_.cache().fetch(std::span(keys).first(n));
  size_t usable = 0;
  for (const auto& e : s.pinned.entries()) {
    if (!e.pinned || e.device_slot < 0) break;
    ++usable;
  }
  // Blocks that did not come up (evicted meanwhile, no room): back to the last snapshot before them.
  // The lookup found a snapshot after block n; only when fewer blocks came up is an earlier one
  // looked for.
  if (usable < n) {
    n = usable;
    while (n > 0 && !cache_.has_snapshot(keys, n - 1)) --n;
  }
  auto snapshot = n > 0 ? cache_.fetch_snapshot(keys, n - 1) : Result<AlignedBuffer>(not_found("no snapshot"));
  if (!snapshot.ok()) {  // counted and logged by the cache: the prompt is computed
    s.pinned = PinnedBlocks();
    return ok_status();
  }
  KVTIER_RETURN_IF_ERROR(states_.upload(static_cast<uint32_t>(s.slot), snapshot->span()));
  for (size_t i = 0; i < n; ++i) {
    const auto& e = s.pinned.entries()[i];
    s.table.push_back(e.device_slot);
    s.out.restored_blocks_by_tier[e.source_tier]++;
  }
  s.restored_blocks = n;
  s.out.cached_tokens = n * bs;
  return ok_status();
}

Result<Generation> HybridGenerator::generate(std::span<const int32_t> prompt, int max_new_tokens, bool use_cache) {
  KVTIER_ASSIGN_OR_RETURN(auto all, generate_batch({std::vector<int32_t>(prompt.begin(), prompt.end())},
                                                   max_new_tokens, use_cache));
  return std::move(all.front());
}

Result<std::vector<Generation>> HybridGenerator::generate_batch(const std::vector<std::vector<int32_t>>& prompts,
                                                                int max_new_tokens, bool use_cache) {
  const size_t bs = static_cast<size_t>(cache_.hasher().block_size());
  KVTIER_RETURN_IF_ERROR(check_generation(prompts, max_new_tokens, model_.config().max_positions));
  if (prompts.size() > states_.slots()) {
    return invalid_argument("generate: " + std::to_string(prompts.size()) + " sequences, " +
                            std::to_string(states_.slots()) + " state slots");
  }
  std::vector<Sequence> seqs(prompts.size());
  const ReleaseOwnedBlocks<Sequence> releaser(gpu_, seqs);
  size_t max_blocks = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    Sequence& s = seqs[i];
    s.tokens = prompts[i];
    s.prompt_len = prompts[i].size();
    s.slot = static_cast<int32_t>(i);
    max_blocks = std::max(max_blocks, (s.prompt_len + max_new_tokens + bs - 1) / bs);
  }
  const auto started = Clock::now();
  // One forward of the given rows (one per sequence in a decode step), each sequence continuing
  // from its state slot; the logits of each piece's last row.
  struct Rows {
    Sequence* s;
    size_t from, to;
  };
  auto forward = [&](const std::vector<Rows>& pieces) -> Result<std::vector<float>> {
    ForwardBatch b;
    b.cu_seqlens_q = {0};
    b.max_blocks_per_seq = static_cast<int32_t>(max_blocks);
    for (const Rows& r : pieces) {
      for (size_t pos = r.from; pos < r.to; ++pos) {
        b.tokens.push_back(r.s->tokens[pos]);
        b.positions.push_back(static_cast<int32_t>(pos));
        b.slot_mapping.push_back(r.s->table[pos / bs] * static_cast<int32_t>(bs) + static_cast<int32_t>(pos % bs));
      }
      b.cu_seqlens_q.push_back(static_cast<int32_t>(b.tokens.size()));
      b.seq_lens.push_back(static_cast<int32_t>(r.to));
      std::vector<int32_t> row = r.s->table;
      row.resize(max_blocks, 0);
      b.block_tables.insert(b.block_tables.end(), row.begin(), row.end());
      b.logit_rows.push_back(static_cast<int32_t>(b.tokens.size()) - 1);
      b.state_slots.push_back(r.s->slot);
    }
    return model_.forward(b, gpu_.pool(), &states_);
  };

  for (Sequence& s : seqs) {
    const auto t0 = Clock::now();
    KVTIER_RETURN_IF_ERROR(restore(s, use_cache));
    s.out.restore_seconds = seconds_since(t0);
    const size_t total = (s.prompt_len + max_new_tokens + bs - 1) / bs;
    KVTIER_ASSIGN_OR_RETURN(auto ids, gpu_.allocate(static_cast<uint32_t>(total - s.table.size())));
    s.table.insert(s.table.end(), ids.begin(), ids.end());
    s.owned = std::move(ids);
    // The rest of the prompt, in pieces that end where the state is snapshotted.
    const auto t1 = Clock::now();
    std::vector<float> logits;
    // The prompt's snapshot goes at its last block end before its last token: the same prompt
    // again restores up to there (one token at least is computed, for the logits), and so does
    // any prompt that extends it.
    const size_t prompt_point = (s.prompt_len - 1) / bs;
    for (size_t from = s.restored_blocks * bs; from < s.prompt_len;) {
      size_t to = s.prompt_len;
      for (size_t k = from / bs + 1; use_cache && k * bs < s.prompt_len; ++k) {
        if (snapshot_point(k, prompt_point)) {
          to = k * bs;
          break;
        }
      }
      KVTIER_ASSIGN_OR_RETURN(logits, forward({{&s, from, to}}));
      if (use_cache && to % bs == 0 && snapshot_point(to / bs, prompt_point)) {
        KVTIER_RETURN_IF_ERROR(take_snapshot(s, to / bs));
      }
      from = to;
    }
    s.out.tokens.push_back(argmax(logits));
    s.out.logits.push_back(std::move(logits));
    s.out.prefill_seconds = seconds_since(t1);
    s.out.first_token_seconds = seconds_since(started);
  }
  const size_t vocab = static_cast<size_t>(model_.config().vocab);
  for (int step = 1; step < max_new_tokens; ++step) {
    std::vector<Rows> rows;
    for (Sequence& s : seqs) {
      const size_t pos = s.tokens.size();  // the last generated token's position
      s.tokens.push_back(s.out.tokens.back());
      rows.push_back({&s, pos, pos + 1});
    }
    KVTIER_ASSIGN_OR_RETURN(std::vector<float> logits, forward(rows));
    for (size_t r = 0; r < rows.size(); ++r) {
      Sequence& s = *rows[r].s;
      std::vector<float> mine(logits.begin() + r * vocab, logits.begin() + (r + 1) * vocab);
      s.out.tokens.push_back(argmax(mine));
      s.out.logits.push_back(std::move(mine));
    }
  }
  // Publish the full blocks whose K/V this call computed in whole chunks of the prompt. A block
  // with a decode step's token (or the prompt's rows after its last whole chunk) has the bits of
  // the token-by-token form, which a prefill of the same text would not give.
  if (use_cache) {
    for (Sequence& s : seqs) {
      const size_t exact = s.prompt_len / GatedDeltaRule::kChunk * GatedDeltaRule::kChunk;
      const std::vector<uint32_t> tokens(s.tokens.begin(), s.tokens.begin() + exact);
      const auto keys = cache_.hasher().keys(tokens, {});
      for (size_t i = s.restored_blocks; i < keys.size(); ++i) {
        (void)gpu_.publish(s.table[i], cache_.hasher().identity(keys, i, {}));
      }
      // Best effort, as publishing blocks is: a snapshot no tier takes is counted and logged there.
      for (const auto& [blocks, bytes] : s.snapshots) (void)cache_.store_snapshot(keys, blocks - 1, {}, bytes);
    }
  }
  std::vector<Generation> out;
  for (Sequence& s : seqs) out.push_back(std::move(s.out));
  return out;
}

}  // namespace kvtier
