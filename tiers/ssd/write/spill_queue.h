// SpillQueue: blocks on their way to the SSD writer, bounded by bytes so the hot path never
// waits on the disk: when the queue is full a push fails at once and the caller drops the block
// (counted). Bytes stay charged until the writer is done with an item, so the bound covers
// everything the spill path holds in memory.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "base/memory/aligned_buffer.h"
#include "serialize/block_hash.h"
#include "tiers/namespace_usage.h"

namespace kvtier {

// One block ready to write: its document sits in `buffer` at kFrameHeaderSize (the writer puts
// the frame header in front of it without copying). Immutable once queued, except by the writer.
struct SpillItem {
  BlockHash hash;
  AlignedBuffer buffer;         // 4 KiB aligned, sized for the padded frame
  size_t document_size = 0;
  uint64_t layout_fingerprint = 0;
  uint32_t token_count = 0;
  // For the block events told when the record is indexed; unknown (empty) for a moved record.
  std::optional<BlockHash> parent_hash;
  std::vector<uint32_t> token_ids;
  uint8_t shuffle_width = 2;    // for the lz4-shuffle codec: the block's element size
  std::string namespace_id;
  uint64_t ticket = 0;          // order of acceptance, for flush()
  uint64_t charged_bytes = 0;
  // What the record's namespace was charged against its SSD quota (none for reinsertions: the
  // record already counted before its segment was reclaimed).
  NamespaceCharge charge;
  // Set for records moved by reinsertion: the buffer already holds a whole frame.
  bool preframed = false;
  size_t frame_size = 0;
};
using SpillItemPtr = std::shared_ptr<SpillItem>;

// Thread-safe: many producers, one consumer.
class SpillQueue {
 public:
  explicit SpillQueue(uint64_t capacity_bytes) : capacity_(capacity_bytes) {}

  // False (and nothing queued) when full or closed.
  bool try_push(SpillItemPtr item);
  // Waits up to `wait` for items, then takes up to `max_items` / about `max_bytes`. An empty
  // result after close() means the queue is drained.
  std::vector<SpillItemPtr> pop_batch(size_t max_items, uint64_t max_bytes,
                                      std::chrono::milliseconds wait);
  // Returns the bytes of finished items to the budget.
  void release(uint64_t bytes);
  // No more pushes; pop_batch returns what is left, then empty.
  void close();
  bool closed() const;
  uint64_t charged_bytes() const;
  size_t queued_items() const;
  uint64_t capacity_bytes() const { return capacity_; }

 private:
  const uint64_t capacity_;
  mutable std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  std::deque<SpillItemPtr> items_;
  uint64_t charged_ = 0;
  bool closed_ = false;
};

}  // namespace kvtier
