// RamTier: blocks in host memory, bounded by bytes, least recently used evicted first (to the
// eviction sink, normally the SSD tier). Optionally keeps blocks affine-quantized (8 or 4 bits,
// lossy, off by default) to hold 2-4x more; quantized blocks are dequantized before they leave for
// SSD (by the SSD tier, on the evicting thread).
#pragma once

#include <list>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "base/log.h"
#include "tiers/tier.h"

namespace kvtier {

struct RamTierOptions {
  uint64_t capacity_bytes = 1ull << 30;
  // When set, dense blocks are quantized on insert. Blocks holding inf/NaN stay dense (counted).
  std::optional<Quantization> quantization;
  std::string name = "ram";  // distinguishes several RAM tiers in metrics
};

struct RamTierMetrics {
  Counter inserts;
  Counter duplicate_inserts;
  Counter rejected_no_room;   // everything pinned, or a block larger than the tier
  Counter evictions;
  Counter hits;
  Counter misses;
  Counter quantized_inserts;
  Counter quantize_skipped;   // blocks with non-finite values, kept dense
  Gauge used_bytes;
  Gauge blocks;
  Gauge pinned_blocks;
};

// Thread-safe. One mutex guards the index and the LRU list; it is never held while block data is
// touched (blocks are immutable and shared) or while evicted blocks are handed down.
class RamTier final : public Tier {
 public:
  explicit RamTier(RamTierOptions options);

  std::string_view name() const override { return options_.name; }
  Result<InsertOutcome> insert(BlockRef block) override;
  bool contains(const BlockHash& hash) const override;
  Presence probe(const BlockRequest& request) const override;
  Result<BlockRef> read(const BlockRequest& request) override;
  bool erase(const BlockHash& hash) override;
  bool pin(const BlockHash& hash) override;
  void unpin(const BlockHash& hash) override;
  uint64_t capacity_bytes() const override { return options_.capacity_bytes; }
  uint64_t used_bytes() const override;
  size_t block_count() const override;
  void visit_metrics(MetricVisitor& visitor) const override;

  const RamTierMetrics& metrics() const { return metrics_; }
  // Hashes from least to most recently used (unpinned only), for tests and debugging.
  std::vector<BlockHash> lru_order() const;
  // Every block held, pinned or not, least recently used first (pinned ones last). For shutdown,
  // which writes what only RAM holds down to the SSD.
  std::vector<BlockRef> blocks() const;

 private:
  struct Entry {
    BlockRef block;
    uint64_t bytes = 0;
    int pins = 0;
    std::list<BlockHash>::iterator lru_pos;  // valid only while pins == 0
  };

  const RamTierOptions options_;
  mutable std::mutex mu_;  // guards index_, lru_, used_
  std::unordered_map<BlockHash, Entry> index_;
  std::list<BlockHash> lru_;  // unpinned entries, least recently used first
  uint64_t used_ = 0;
  RamTierMetrics metrics_;
  LogThrottle quantize_skip_log_;
};

}  // namespace kvtier
