// Which Gated DeltaNet state snapshots a hybrid prefix cache keeps (issue 35), replayed on a
// BlockTrace. A hybrid prefix is restorable only up to a block that has both its KV (here every
// block seen before: the KV tiers are assumed large enough, to isolate the snapshot policy) and a
// snapshot of every GDN layer's state taken at its end. Snapshots cost far more than a block's KV
// (the tiny hybrid layout: 438 KiB against 16 KiB), so which ones to keep decides the hit ratio
// per byte.
//
// A request restores the longest such prefix, computes the rest, and may then store snapshots at
// any block end it computed (never inside the part it restored):
//   every-block    at every block end
//   end-only       at the prompt's last full block
//   every-n        every n blocks, and at the end
//   branch-points  at the end, and where this prompt left a prefix an earlier one had (the block
//                  where the KV match ended, when it ended before the prompt did): the divergence
//                  points Marconi (MLSys 2025) admits, found as they are observed, no lookahead.
// With a capacity, snapshots beyond it go least recently used first.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "bench/traces/belady.h"

namespace kvtier::bench {

enum class SnapshotPolicy { kEveryBlock, kEndOnly, kEveryN, kBranchPoints };
Result<SnapshotPolicy> parse_snapshot_policy(std::string_view name);  // "every-block", ...
std::string_view snapshot_policy_name(SnapshotPolicy p);

struct SnapshotReplay {
  uint64_t prompt_tokens = 0;
  uint64_t hit_tokens = 0;          // restored: KV and a snapshot at the prefix's end
  double hit_token_pairs = 0;       // (token, earlier token) pairs inside restored prefixes: what
                                    // attention would have cost to recompute them
  uint64_t kv_match_tokens = 0;     // what the KV alone would have served (an upper bound)
  uint64_t snapshots_written = 0;   // each one a prefill's state copied out
  uint64_t snapshots_peak = 0;      // the most held at once (with no capacity: at the end)
  double hit_ratio() const { return prompt_tokens ? double(hit_tokens) / prompt_tokens : 0; }
};

SnapshotReplay replay_snapshots(const BlockTrace& trace, SnapshotPolicy policy, int every_n = 8,
                                size_t capacity = std::numeric_limits<size_t>::max());

}  // namespace kvtier::bench
