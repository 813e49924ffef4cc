// A TieredCache of a RAM tier over a real SSD tier in a temporary directory, with blocks a model
// would compute: for the cache tests that need a disk below memory (fetch_async, erase races).
#pragma once

#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "cache/tiered_cache.h"
#include "tests/cache/cache_test_blocks.h"
#include "tests/support/temp_dir.h"
#include "tests/support/test_blocks.h"
#include "tests/tiers/ssd/ssd_test_env.h"
#include "tiers/ram_tier.h"

namespace kvtier::testing {

// 16 KiB blocks of 16 tokens: a block read back from the SSD keeps its 4 KiB-padded record, so
// blocks much smaller than that would weigh several times more in RAM after the load than before.
inline std::shared_ptr<const KvLayout> ssd_sized_layout() {
  static auto l = share(KvLayout::uniform("ram-over-ssd", 2, 2, 64, 16, DType::kBF16));
  return l;
}

inline PrefixHasher ssd_sized_hasher() { return hasher_of(*ssd_sized_layout()); }

inline BlockRef ssd_sized_block(const PrefixHasher& h, const std::vector<BlockKey>& keys, size_t i) {
  return computed_block(ssd_sized_layout(), h, keys, i);
}

struct RamOverSsd {
  // RAM of `ram_bytes` (LRU, so tests know what leaves first) over an SSD in `dir`.
  RamOverSsd(const std::string& dir, uint64_t ram_bytes) {
    auto registry = std::make_shared<LayoutRegistry>();
    EXPECT_TRUE(registry->add(*ssd_sized_layout()).ok());
    auto s = SsdTier::open(small_ssd_options(dir), registry);
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    if (s.ok()) ssd = std::move(s).value();
    RamTierOptions o;
    o.capacity_bytes = ram_bytes;
    o.eviction = "lru";
    ram = std::make_shared<RamTier>(o);
    cache = std::make_unique<TieredCache>(std::vector<std::shared_ptr<Tier>>{ram, ssd});
  }
  std::shared_ptr<SsdTier> ssd;
  std::shared_ptr<RamTier> ram;
  std::unique_ptr<TieredCache> cache;
};

}  // namespace kvtier::testing
