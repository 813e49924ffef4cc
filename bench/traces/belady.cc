#include "bench/traces/belady.h"

#include <limits>
#include <queue>
#include <unordered_map>

namespace kvtier::bench {

BlockTrace to_block_trace(const Trace& trace, const PrefixHasher& hasher) {
  BlockTrace out;
  out.block_size = hasher.block_size();
  std::unordered_map<BlockHash, uint32_t> ids;
  for (const TraceRequest& r : trace.requests) {
    const std::vector<uint32_t> tokens = r.expand();
    out.prompt_tokens += tokens.size();
    std::vector<uint32_t> blocks;
    const std::vector<BlockHash> hashes = hasher.hash_prefix(tokens, {});
    for (size_t i = 0; i < hashes.size(); ++i) {
      auto [it, fresh] = ids.emplace(hashes[i], static_cast<uint32_t>(ids.size()));
      if (fresh) out.depth.push_back(static_cast<uint32_t>(i));
      blocks.push_back(it->second);
    }
    out.requests.push_back(std::move(blocks));
  }
  return out;
}

BeladyResult belady(const BlockTrace& trace, size_t capacity) {
  constexpr uint32_t kNever = std::numeric_limits<uint32_t>::max();
  const size_t n = trace.requests.size();
  // next[r][i]: the next request after r that uses block trace.requests[r][i].
  std::vector<std::vector<uint32_t>> next(n);
  std::vector<uint32_t> seen_at(trace.depth.size(), kNever);
  for (size_t r = n; r-- > 0;) {
    const auto& blocks = trace.requests[r];
    next[r].resize(blocks.size());
    for (size_t i = 0; i < blocks.size(); ++i) {
      next[r][i] = seen_at[blocks[i]];
      seen_at[blocks[i]] = static_cast<uint32_t>(r);
    }
  }
  std::vector<uint32_t> resident_next(trace.depth.size(), 0);  // 0: not resident
  std::vector<bool> resident(trace.depth.size(), false);
  using Key = std::pair<std::pair<uint32_t, uint32_t>, uint32_t>;  // ((next use, depth), block)
  std::priority_queue<Key> heap;  // farthest next use, then deepest, on top
  size_t size = 0;
  BeladyResult out;
  for (size_t r = 0; r < n; ++r) {
    const auto& blocks = trace.requests[r];
    bool prefix = true;
    for (size_t i = 0; i < blocks.size(); ++i) {
      const uint32_t b = blocks[i];
      if (prefix && resident[b]) {
        ++out.hit_blocks;
        out.hit_tokens += trace.block_size;
      } else {
        prefix = false;
      }
      if (!resident[b]) {
        resident[b] = true;
        ++size;
      }
      resident_next[b] = next[r][i];
      heap.push({{next[r][i], trace.depth[b]}, b});
    }
    while (size > capacity) {
      const Key top = heap.top();
      heap.pop();
      const uint32_t b = top.second;
      if (!resident[b] || resident_next[b] != top.first.first) continue;  // stale entry
      resident[b] = false;
      --size;
    }
  }
  return out;
}

}  // namespace kvtier::bench
