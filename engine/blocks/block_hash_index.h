// BlockHashIndex: the GPU block pool's hash -> block id map, flat. A GPU hit looks up and pins
// hundreds of blocks before its forward can start, and with the CPU's caches cold (a server's
// other work between requests) a node-based map cost two misses per block, one after the other
// (bucket, then node). Here an entry is the hash and the id side by side, found where the hash
// says (open addressing, linear probing), so a lookup is one miss that a caller walking a prefix
// can start early (prefetch()). The pool never caches more hashes than it has blocks, so the
// table is sized once, at least twice that, and never grows.
//
// The slot a hash goes to is the top bits of BlockHashHasher (all 32 bytes mixed with odd factors
// drawn at start): the hashes may come from clients (PUT), and a fixed rule would let one craft
// hashes that all probe the same run.
// Not thread-safe (the pool's lock).
#pragma once

#include <cstdint>
#include <vector>

#include "serialize/block_hash.h"

namespace kvtier {

class BlockHashIndex {
 public:
  // Room for `max_entries` hashes.
  explicit BlockHashIndex(size_t max_entries);

  // The id stored under `hash`, or -1.
  int32_t find(const BlockHash& hash) const;
  // Stores `hash` -> `id` (id >= 0). The hash must be absent and fewer than max_entries stored.
  void insert(const BlockHash& hash, int32_t id);
  // False when `hash` was absent.
  bool erase(const BlockHash& hash);
  size_t size() const { return size_; }
  // Brings the cache line find(hash) starts at towards the CPU, without waiting for it.
  void prefetch(const BlockHash& hash) const { __builtin_prefetch(&entries_[home(hash)]); }

 private:
  struct Entry {
    BlockHash hash;
    int32_t id = -1;  // -1: empty
  };
  size_t home(const BlockHash& hash) const;
  size_t next(size_t i) const { return (i + 1) & mask_; }

  std::vector<Entry> entries_;
  size_t mask_ = 0;
  int shift_ = 0;
  size_t size_ = 0;
};

}  // namespace kvtier
