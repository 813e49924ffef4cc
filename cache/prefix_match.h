// PrefixMatch: what a lookup tells a caller outside the cache — kvtierd's /v1/lookup, the
// in-process door, Python and the C ABI alike: the longest cached prefix, the tier each of its
// blocks lies in, and what loading them would cost, to weigh against recomputing them.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "serialize/block_hash.h"

namespace kvtier {

// The blocks of a prefix that one tier below the top holds, and the predicted seconds to bring
// them up (nullopt until a load from that tier has measured its rate).
struct LoadEstimate {
  std::string tier;
  size_t blocks = 0;
  std::optional<double> seconds;
};

struct PrefixMatch {
  size_t matched_tokens = 0;
  struct Cached {
    BlockHash hash;
    std::string tier;  // "gpu", "ram", "ssd", "remote"
  };
  std::vector<Cached> blocks;  // the cached prefix, in order
  std::vector<LoadEstimate> load_estimates;
};

}  // namespace kvtier
