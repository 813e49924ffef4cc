// Helpers for SSD tier tests: a small tier in a temporary directory, blocks with real prefix
// hashes, and the knobs tests turn.
#pragma once

#include <fcntl.h>
#include <sys/mount.h>
#include <unistd.h>

#include <memory>
#include <numeric>
#include <string>

#include "cache/prefix_hasher.h"
#include "tests/support/temp_dir.h"
#include "tests/support/test_blocks.h"
#include "tiers/ssd/ssd_tier.h"

namespace kvtier::testing {

inline SsdTierOptions small_ssd_options(const std::string& dir) {
  SsdTierOptions o;
  o.dir = dir;
  o.segment_size = 1 << 20;
  o.capacity_bytes = 16 << 20;
  o.spill_queue_bytes = 64 << 20;
  o.drain_timeout = std::chrono::seconds(30);
  return o;
}

// A one-block prompt's block for `layout`, identified by a real prefix hash of its tokens
// (seed*block_size ...), with data derived from the seed.
inline BlockRef seeded_block(const std::shared_ptr<const KvLayout>& layout, uint64_t seed,
                             Values values = Values::kRandom, const std::string& ns = "test") {
  PrefixHasher h(HashAlgorithm::kSha256, Namespace{ns, layout->fingerprint(), ""},
                 layout->block_size);
  std::vector<uint32_t> tokens(layout->block_size);
  std::iota(tokens.begin(), tokens.end(), static_cast<uint32_t>(seed * layout->block_size));
  auto keys = h.keys(tokens, {});
  Block b = make_block(layout, seed, values);
  b.mutable_identity() = h.identity(keys, 0, {});
  return std::make_shared<const Block>(std::move(b));
}

inline BlockRequest request_for(const BlockRef& b) {
  return {b->hash(), b->identity().token_ids};
}

// A tmpfs of `bytes` mounted on a fresh directory (for ENOSPC). Needs CAP_SYS_ADMIN; mounted()
// says whether it worked.
class SmallFilesystem {
 public:
  explicit SmallFilesystem(uint64_t bytes) {
    const std::string opts = "size=" + std::to_string(bytes);
    mounted_ = ::mount("kvtier-test", dir_.str().c_str(), "tmpfs", 0, opts.c_str()) == 0;
    error_ = mounted_ ? 0 : errno;
  }
  ~SmallFilesystem() {
    if (mounted_) ::umount2(dir_.str().c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }
  int error() const { return error_; }
  std::string path() const { return dir_.str(); }

 private:
  TempDir dir_;
  bool mounted_ = false;
  int error_ = 0;
};

}  // namespace kvtier::testing
