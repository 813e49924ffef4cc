// BlockHash for spdlog/fmt: a hash passed to a log call is turned into hex only if the line is
// written. Throttled drop logs (LogThrottle) evaluate their arguments on every drop and format
// them on one in many; `block->hash().hex()` there allocated a string per evicted block.
// Internal: the installed C++ API does not depend on fmt.
#pragma once

#include <spdlog/fmt/fmt.h>

#include "serialize/block_hash.h"

template <>
struct fmt::formatter<kvtier::BlockHash> : fmt::formatter<std::string_view> {
  template <typename Context>
  auto format(const kvtier::BlockHash& h, Context& ctx) const {
    return fmt::formatter<std::string_view>::format(h.hex(), ctx);
  }
};
