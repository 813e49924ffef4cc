// A clairvoyant SSD admission rule for the replay: a block leaving RAM is written only if the trace
// uses it again within `horizon` requests, and at least `min_uses` times from now on. No cache can
// run it (it reads the future); the replay runs it to measure what any admission rule could reach
// on a trace — the hit ratio a write budget leaves at best — so a rule's figures can be read
// against that frontier, not only against Belady's (which writes whatever it likes).
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "serialize/block_hash.h"
#include "tiers/policy/admission_policy.h"

namespace kvtier::bench {

class NextUseAdmission final : public AdmissionPolicy {
 public:
  static constexpr size_t kForever = std::numeric_limits<size_t>::max();
  // `uses`: per block, the requests that look it up, in order.
  NextUseAdmission(std::unordered_map<BlockHash, std::vector<uint32_t>> uses, size_t horizon,
                   size_t min_uses = 1);

  struct Rule {
    size_t horizon = kForever;
    size_t min_uses = 1;
  };
  // "oracle" (any later use), "oracle:H" (the next use within H requests) or "oracle:H:M" (and M
  // uses or more to come; H may be "inf"); not_found for other names.
  static Result<Rule> parse(const std::string& name);

  std::string_view name() const override { return "oracle"; }
  void used(const BlockHash&) override {}
  bool admit(const BlockHash& hash, uint64_t bytes) override;
  // The request being replayed: evictions from here on are judged against the uses after it.
  void at_request(uint32_t request) { now_ = request; }

 private:
  std::unordered_map<BlockHash, std::vector<uint32_t>> uses_;
  size_t horizon_;
  size_t min_uses_;
  uint32_t now_ = 0;
};

}  // namespace kvtier::bench
