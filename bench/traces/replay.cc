#include "bench/traces/replay.h"

#include <chrono>
#include <filesystem>
#include <unordered_set>

#include "bench/traces/next_use_admission.h"
#include "cache/cache_stack.h"
#include "cache/prefix_hasher.h"
#include "serialize/format/block_codec.h"
#include "serialize/format/frame.h"
#include "tiers/ssd/ssd_state.h"

namespace kvtier::bench {

std::shared_ptr<const KvLayout> replay_layout(uint32_t block_tokens) {
  // One layer, one head of 8: a block's bytes matter only for capacities, so they stay small.
  return std::make_shared<const KvLayout>(
      KvLayout::uniform("replay", 1, 1, 8, static_cast<int>(block_tokens), DType::kBF16));
}

uint64_t replay_ram_bytes_per_block(uint32_t block_tokens) {
  const auto layout = replay_layout(block_tokens);
  BlockIdentity id;
  id.token_ids.resize(layout->block_size);
  return Block::dense(layout, id).size_bytes();
}

uint64_t replay_ssd_bytes_per_block(uint32_t block_tokens) {
  // A record as the SSD tier writes one: a chained block's document, framed, padded.
  const auto layout = replay_layout(block_tokens);
  const PrefixHasher hasher(HashAlgorithm::kXxh3, Namespace{"replay", layout->fingerprint(), ""},
                            layout->block_size);
  const std::vector<uint32_t> tokens(2 * size_t{block_tokens}, 7);
  const auto keys = hasher.keys(tokens, {});
  Bytes document;
  if (!BlockCodec::encode_document(Block::dense(layout, hasher.identity(keys, 1, {})), document)
           .ok()) {
    return record_padded(kFrameHeaderSize +
                         replay_ram_bytes_per_block(block_tokens));  // not reached
  }
  return record_padded(max_frame_size(document.size(), FrameCodec::kNone));
}

Result<ReplayResult> replay(const Trace& trace, const ReplayOptions& o) {
  const auto layout = replay_layout(o.block_tokens);
  const uint64_t record = replay_ssd_bytes_per_block(o.block_tokens);
  CacheStackOptions so;
  so.layout = layout;
  so.ram.capacity_bytes = o.ram_blocks * replay_ram_bytes_per_block(o.block_tokens);
  so.ram.eviction = o.eviction;
  so.ssd_admission = o.admission;
  const Result<NextUseAdmission::Rule> oracle_rule = NextUseAdmission::parse(o.admission);
  if (!oracle_rule.ok() && oracle_rule.status().code() != StatusCode::kNotFound)
    return oracle_rule.status();
  if (oracle_rule.ok()) so.ssd_admission = "all";  // replaced below, once the stack is open
  if (o.ssd_blocks > 0) {
    SsdTierOptions s;
    s.dir = (std::filesystem::path(o.scratch_dir) / "ssd").string();
    s.reset = true;
    // Eight segments or so: reclaim (whole oldest segments) then costs at most an eighth.
    s.segment_size =
        std::max<uint64_t>(1 << 20, o.ssd_blocks * record / 8 / kRecordAlign * kRecordAlign);
    s.capacity_bytes = std::max<uint64_t>(2 * s.segment_size, o.ssd_blocks * record);
    so.ssd = s;
  }
  KVTIER_ASSIGN_OR_RETURN(auto stack, CacheStack::open(so));
  const PrefixHasher hasher(HashAlgorithm::kXxh3, Namespace{"replay", layout->fingerprint(), ""}, layout->block_size);
  const auto& tiers = stack->cache().tiers();
  NextUseAdmission* oracle = nullptr;
  if (oracle_rule.ok() && o.ssd_blocks > 0) {
    std::unordered_map<BlockHash, std::vector<uint32_t>> uses;
    for (size_t r = 0; r < trace.requests.size(); ++r) {
      for (const BlockHash& h : hasher.hash_prefix(trace.requests[r].expand(), {})) {
        std::vector<uint32_t>& u = uses[h];
        if (u.empty() || u.back() != r) u.push_back(static_cast<uint32_t>(r));
      }
    }
    auto policy = std::make_unique<NextUseAdmission>(std::move(uses), oracle_rule->horizon,
                                                     oracle_rule->min_uses);
    oracle = policy.get();
    for (size_t t = 0; t < tiers.size(); ++t) {
      if (tiers[t]->name() == "ssd") stack->cache().set_admission(t, std::move(policy));
    }
  }
  ReplayResult out;
  std::unordered_set<BlockHash> read_back;
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t request = 0; request < trace.requests.size(); ++request) {
    const TraceRequest& r = trace.requests[request];
    if (oracle) oracle->at_request(static_cast<uint32_t>(request));
    const std::vector<uint32_t> tokens = r.expand();
    out.prompt_tokens += tokens.size();
    const std::vector<BlockKey> keys = hasher.keys(tokens, {});
    size_t served = 0;
    {
      PinnedBlocks pinned = stack->cache().fetch(keys);
      for (const PinnedBlocks::Entry& e : pinned.entries()) {
        const std::string_view tier = tiers[e.source_tier]->name();
        if (tier == "ssd") {
          out.hit_tokens_ssd += layout->block_size;
          read_back.insert(e.hash);
        } else {
          out.hit_tokens_ram += layout->block_size;
        }
      }
      served = pinned.size();
    }
    for (size_t i = served; i < keys.size(); ++i) {
      // The engine computed these: their bytes do not matter here, only their identities.
      auto block = std::make_shared<const Block>(Block::dense(layout, hasher.identity(keys, i, {})));
      (void)stack->cache().insert(std::move(block));  // refusals are counted by the cache
    }
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (StripedSsdTier* ssd = stack->ssd()) {
    ssd->flush();
    out.ssd_blocks_written = ssd->total(&SsdTierMetrics::spill_written);
    out.ssd_bytes_written = ssd->total(&SsdTierMetrics::spill_bytes_written);
  }
  out.ssd_blocks_read_back = read_back.size();
  out.not_admitted = stack->cache().metrics().dropped_not_admitted.value();
  return out;
}

}  // namespace kvtier::bench
