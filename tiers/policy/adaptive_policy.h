// AdaptivePolicy: evicts as whichever of chain-lru and s3fifo has been hitting more lately on
// this tier's own traffic. Neither wins everywhere (hit_ratio_bench, RAM 5 % of the working set:
// chain-lru by 5.6 points on the agent trace, s3fifo by 10 on rag), and a tier cannot know its
// traffic in advance. So each candidate runs twice: once over the tier's blocks (told everything
// the tier does, so either can name the next victim at once) and once as a shadow, a simulation
// over block hashes alone at the tier's capacity, fed the same references (every insert and
// read). A shadow's hits count as a prefix lookup would find them: a block is a hit when it is
// held and so was the block before it in the same prompt walk. Recent hits weigh more (an
// exponential window of eight tier-fulls of references), and the lead changes only when the
// other shadow has hit 10 % more: switching costs hits (the new leader's queues were shaped by
// the old one's choices), so near-ties stay with the leader. chain-lru leads at first.
// A read tells the leader at once and only logs itself for the rest: the other candidate and the
// shadows replay the log, a bounded slice at a time, when the tier next evicts. So a 511-block
// prefix read on its way to an engine costs what it costs under the leader alone, plus a log entry
// per block. (Telling both candidates at once cost an 8B / 8k CUDA load read in place 1.7 % of its
// rate on the H200 host, 0.855-0.857 of pinned against chain-lru's 0.872-0.874 in one call; told
// this way, 0.857-0.860 against 0.851-0.867 in the next.)
// Not thread-safe (the tier's lock). Memory: a hash per block each shadow holds, and the log.
#pragma once

#include <array>
#include <deque>
#include <memory>
#include <unordered_map>

#include "tiers/policy/eviction_policy.h"

namespace kvtier {

class AdaptivePolicy final : public EvictionPolicy {
 public:
  AdaptivePolicy();
  std::string_view name() const override { return "adaptive"; }
  void set_capacity(uint64_t bytes) override;
  void inserted(const BlockHash& hash, const BlockHash& parent, uint64_t bytes) override;
  void inserted_snapshot(const BlockHash& hash, const BlockHash& parent, uint64_t bytes) override;
  void accessed(const BlockHash& hash) override;
  void pinned(const BlockHash& hash) override;
  void unpinned(const BlockHash& hash) override;
  void removed(const BlockHash& hash) override;
  std::optional<BlockHash> victim() override;
  std::optional<BlockHash> orphan() override;
  std::string_view active() const override;
  uint64_t active_changes() const override { return switches_; }

 private:
  static constexpr size_t kCandidates = 2;
  struct Reference {
    BlockHash hash, parent;  // parent, bytes and snapshot: an insert's (a read finds them later)
    uint64_t bytes = 0;
    bool snapshot = false;
    bool read = false;
    uint8_t told = 0;  // a read: the candidate told at once (the leader then)
  };
  // One candidate's simulation: the blocks it would hold at the tier's capacity.
  struct Shadow {
    std::unique_ptr<EvictionPolicy> policy;
    std::unordered_map<BlockHash, uint64_t> held;  // hash -> bytes
    uint64_t bytes = 0;
    bool last_hit = false;  // whether the previous reference was a hit here
    double score = 0;       // hit bytes, recent ones weighing more
    void evict_one(const BlockHash& hash);
  };
  void log(const Reference& r);
  void simulate_log();
  void simulate(const Reference& r);
  void choose_leader();

  std::array<std::unique_ptr<EvictionPolicy>, kCandidates> real_;
  std::array<Shadow, kCandidates> shadows_;
  struct Resident {
    BlockHash parent;
    uint64_t bytes = 0;
    bool snapshot = false;
  };
  std::unordered_map<BlockHash, Resident> resident_;  // the tier's blocks, for the shadows
  std::deque<Reference> log_;                         // references not yet simulated, oldest first
  uint64_t capacity_ = 0;  // 0 until the tier says: the shadows hold nothing
  BlockHash previous_;     // the hash simulated last (a prompt walk continues from it)
  bool have_previous_ = false;
  size_t leader_ = 0;
  uint64_t switches_ = 0;
};

}  // namespace kvtier
