// The snapshot policies of a hybrid prefix cache, on hand-made block traces whose answers are known.
#include <gtest/gtest.h>

#include "bench/traces/snapshot_policy.h"

namespace kvtier::bench {
namespace {

BlockTrace trace_of(std::vector<std::vector<uint32_t>> requests) {
  BlockTrace t;
  t.block_size = 16;
  uint32_t max_id = 0;
  for (const auto& r : requests) {
    t.prompt_tokens += r.size() * 16;
    for (uint32_t b : r) max_id = std::max(max_id, b);
  }
  t.depth.assign(max_id + 1, 0);
  t.requests = std::move(requests);
  return t;
}

TEST(SnapshotPolicyTest, AConversationThatGrowsIsServedFromTheLastTurnsEnd) {
  // Turn 2 extends turn 1, turn 3 extends turn 2: the previous prompt's end is always restorable.
  const BlockTrace t = trace_of({{1, 2, 3}, {1, 2, 3, 4, 5}, {1, 2, 3, 4, 5, 6, 7}});
  for (auto p : {SnapshotPolicy::kEveryBlock, SnapshotPolicy::kEndOnly, SnapshotPolicy::kBranchPoints}) {
    const SnapshotReplay r = replay_snapshots(t, p);
    EXPECT_EQ(r.hit_tokens, (3 + 5) * 16u) << snapshot_policy_name(p);
    EXPECT_EQ(r.kv_match_tokens, r.hit_tokens);
  }
  EXPECT_EQ(replay_snapshots(t, SnapshotPolicy::kEndOnly).snapshots_written, 3u);
  EXPECT_EQ(replay_snapshots(t, SnapshotPolicy::kEveryBlock).snapshots_written, 7u);
}

TEST(SnapshotPolicyTest, ASharedDocumentIsFoundAsABranchPointTheSecondTimeItIsSeen) {
  // A document of three blocks, each time followed by another question.
  const BlockTrace t = trace_of({{1, 2, 3, 10}, {1, 2, 3, 11}, {1, 2, 3, 12}, {1, 2, 3, 13}});
  const SnapshotReplay end_only = replay_snapshots(t, SnapshotPolicy::kEndOnly);
  const SnapshotReplay branch = replay_snapshots(t, SnapshotPolicy::kBranchPoints);
  const SnapshotReplay every = replay_snapshots(t, SnapshotPolicy::kEveryBlock);
  EXPECT_EQ(end_only.hit_tokens, 0u);        // the KV is there, a state at its end never is
  EXPECT_EQ(end_only.kv_match_tokens, 3 * 3 * 16u);
  EXPECT_EQ(every.hit_tokens, 3 * 3 * 16u);  // everything the KV serves
  EXPECT_EQ(branch.hit_tokens, 2 * 3 * 16u);  // all but the second request, which finds the branch
  EXPECT_EQ(branch.snapshots_written, 5u);    // four ends and one branch point
  EXPECT_EQ(every.snapshots_written, 4u + 3u);
}

TEST(SnapshotPolicyTest, EveryNBlocksAndTheEnd) {
  const BlockTrace t = trace_of({{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, {1, 2, 3, 4, 5, 6, 7, 20}});
  const SnapshotReplay r = replay_snapshots(t, SnapshotPolicy::kEveryN, /*every_n=*/4);
  EXPECT_EQ(r.hit_tokens, 4 * 16u);  // the second prompt matches 7 blocks; the last snapshot at 4
  EXPECT_EQ(r.snapshots_written, 3u + 1u);  // 4, 8, 10; then the second prompt's end (8 blocks)
}

TEST(SnapshotPolicyTest, PastItsCapacityTheLeastRecentlyUsedSnapshotGoes) {
  // Capacity 1: the second document's snapshot pushes the first's out.
  const BlockTrace t = trace_of({{1, 2}, {5, 6}, {1, 2, 3}, {5, 6, 7}});
  const SnapshotReplay r = replay_snapshots(t, SnapshotPolicy::kEndOnly, 8, /*capacity=*/1);
  EXPECT_EQ(r.hit_tokens, 0u);
  EXPECT_EQ(r.snapshots_peak, 1u);
  // Capacity 2: the first document's is used (and so kept), the third prompt's end pushes the
  // second document's out before the fourth prompt asks for it. Capacity 3 keeps both.
  EXPECT_EQ(replay_snapshots(t, SnapshotPolicy::kEndOnly, 8, 2).hit_tokens, 2 * 16u);
  EXPECT_EQ(replay_snapshots(t, SnapshotPolicy::kEndOnly, 8, 3).hit_tokens, (2 + 2) * 16u);
}

TEST(SnapshotPolicyTest, NamesParseBackAndUnknownOnesAreRefused) {
  for (auto p : {SnapshotPolicy::kEveryBlock, SnapshotPolicy::kEndOnly, SnapshotPolicy::kEveryN,
                 SnapshotPolicy::kBranchPoints}) {
    EXPECT_EQ(*parse_snapshot_policy(snapshot_policy_name(p)), p);
  }
  EXPECT_EQ(parse_snapshot_policy("lru").status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier::bench
