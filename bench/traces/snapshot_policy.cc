#include "bench/traces/snapshot_policy.h"

#include <list>
#include <unordered_map>
#include <unordered_set>

namespace kvtier::bench {

Result<SnapshotPolicy> parse_snapshot_policy(std::string_view name) {
  for (SnapshotPolicy p : {SnapshotPolicy::kEveryBlock, SnapshotPolicy::kEndOnly, SnapshotPolicy::kEveryN,
                           SnapshotPolicy::kBranchPoints}) {
    if (snapshot_policy_name(p) == name) return p;
  }
  return invalid_argument("snapshot policy '" + std::string(name) +
                          "': one of every-block, end-only, every-n, branch-points");
}

std::string_view snapshot_policy_name(SnapshotPolicy p) {
  switch (p) {
    case SnapshotPolicy::kEveryBlock: return "every-block";
    case SnapshotPolicy::kEndOnly: return "end-only";
    case SnapshotPolicy::kEveryN: return "every-n";
    case SnapshotPolicy::kBranchPoints: return "branch-points";
  }
  return "?";
}

namespace {

// Snapshots by the block they end at, least recently used at the front.
class SnapshotStore {
 public:
  explicit SnapshotStore(size_t capacity) : capacity_(capacity) {}
  bool holds(uint32_t block) const { return where_.count(block) != 0; }
  void touch(uint32_t block) { order_.splice(order_.end(), order_, where_.at(block)); }
  // True when newly written.
  bool put(uint32_t block) {
    if (holds(block)) {
      touch(block);
      return false;
    }
    if (capacity_ == 0) return false;
    order_.push_back(block);
    where_[block] = std::prev(order_.end());
    while (order_.size() > capacity_) {
      where_.erase(order_.front());
      order_.pop_front();
    }
    return true;
  }
  size_t size() const { return order_.size(); }

 private:
  size_t capacity_;
  std::list<uint32_t> order_;
  std::unordered_map<uint32_t, std::list<uint32_t>::iterator> where_;
};

}  // namespace

SnapshotReplay replay_snapshots(const BlockTrace& trace, SnapshotPolicy policy, int every_n, size_t capacity) {
  SnapshotReplay out;
  out.prompt_tokens = trace.prompt_tokens;
  const uint64_t bs = static_cast<uint64_t>(trace.block_size);
  std::unordered_set<uint32_t> kv;  // blocks whose KV is cached
  SnapshotStore snapshots(capacity);
  for (const std::vector<uint32_t>& blocks : trace.requests) {
    const size_t n = blocks.size();
    size_t match = 0;  // leading blocks whose KV is cached
    while (match < n && kv.count(blocks[match])) ++match;
    size_t restored = match;  // back to the last block end with a snapshot
    while (restored > 0 && !snapshots.holds(blocks[restored - 1])) --restored;
    if (restored > 0) snapshots.touch(blocks[restored - 1]);
    out.hit_tokens += restored * bs;
    out.hit_token_pairs += static_cast<double>(restored * bs) * static_cast<double>(restored * bs - (restored ? 1 : 0)) / 2;
    out.kv_match_tokens += match * bs;
    // The blocks after `restored` are computed: their ends are where snapshots can be taken.
    auto snapshot_at = [&](size_t end) {  // end: a block count, restored < end <= n
      if (end > restored && end <= n && snapshots.put(blocks[end - 1])) ++out.snapshots_written;
    };
    switch (policy) {
      case SnapshotPolicy::kEveryBlock:
        for (size_t e = restored + 1; e <= n; ++e) snapshot_at(e);
        break;
      case SnapshotPolicy::kEndOnly:
        snapshot_at(n);
        break;
      case SnapshotPolicy::kEveryN:
        for (size_t e = restored + 1; e <= n; ++e) {
          if (e % static_cast<size_t>(every_n) == 0) snapshot_at(e);
        }
        snapshot_at(n);
        break;
      case SnapshotPolicy::kBranchPoints:
        if (match > 0 && match < n) snapshot_at(match);  // this prompt left an earlier one's prefix here
        snapshot_at(n);
        break;
    }
    for (uint32_t b : blocks) kv.insert(b);
    out.snapshots_peak = std::max<uint64_t>(out.snapshots_peak, snapshots.size());
  }
  return out;
}

}  // namespace kvtier::bench
