// SsdIndex: the SSD tier's index in RocksDB. Three key spaces (all integers big-endian in keys,
// so a segment's keys sort by offset; little-endian in values):
//
//   'b' + hash[32]               -> IndexEntry      where a block's record is, and how to check it
//   's' + segment u64 + offset   -> hash[32]        every record of a segment, for reclaim and fsck
//   'g' + segment u64            -> SegmentRecord   how far a segment was written durably, live
//   bytes
//
// IndexEntry value (62 + namespace bytes):
//   u8 version(1) | u8[3] 0 | u64 segment | u64 offset | u32 length | u32 token_count |
//   u64 frame payload checksum | u64 layout fingerprint | u64 write sequence |
//   u16 namespace length | namespace bytes | u64 xxh3-64 of all the bytes before it
// The trailing checksum makes a damaged value detectable (it is quarantined like a damaged record).
//
// Tuned for small values: no compression, a bloom filter on whole keys, a 64 MiB block cache.
// Which blocks it holds is also kept in memory (a FingerprintSet, built by a thread of its own
// after open and kept in step by every commit): a prefix's lookup asks hundreds of keys at once,
// and a plan over 511 blocks on the SSD took 1.6-3.1 ms on the H200 host (a cold block cache after
// a restart; 0.65-1.0 ms on this project's VM, 0.16 with the set), where a plan's whole budget is
// a few percent of a 44 ms prefill.
// Writes are WriteBatches (a spill batch's entries commit at once); the WAL is written without
// fsync: a process crash loses nothing (the OS holds it), a power loss may lose index entries
// whose data is on disk, which become orphaned bytes — never wrong data.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"
#include "serialize/block_hash.h"
#include "tiers/ssd/index/fingerprint_set.h"

namespace rocksdb {
class DB;
class WriteBatch;
}  // namespace rocksdb

namespace kvtier {

struct IndexEntry {
  uint64_t segment = 0;
  uint64_t offset = 0;
  uint32_t length = 0;  // frame bytes (the record on disk is padded to 4 KiB)
  uint32_t token_count = 0;
  uint64_t checksum = 0;  // the frame's payload checksum: ties the entry to exactly one record
  uint64_t layout_fingerprint = 0;
  uint64_t write_seq = 0;
  std::string namespace_id;
  bool operator==(const IndexEntry&) const = default;
};
std::string encode_index_entry(const IndexEntry& e);
Result<IndexEntry> decode_index_entry(std::string_view value);

struct SegmentRecord {
  uint64_t id = 0;
  uint64_t watermark = 0;  // bytes written and made durable from the start of the segment
  uint64_t live_bytes = 0;  // padded bytes of records still indexed
  uint64_t live_entries = 0;
  uint64_t created_unix = 0;
};

class SsdIndex;

struct SsdIndexOptions {
  // The in-memory set of held blocks (holds()): a tier's lookups want it; kvtier-fsck, which reads
  // every entry itself, does not.
  bool held_in_memory = true;
  // Tests: called on the builder's thread once its scan's snapshot is taken, before it reads a
  // key, so commits made here are ones the snapshot cannot see.
  std::function<void(SsdIndex&)> after_scan_snapshot;
};

// Thread-safe (RocksDB is).
class SsdIndex {
 public:
  static Result<std::unique_ptr<SsdIndex>> open(const std::string& path,
                                                SsdIndexOptions options = {});
  ~SsdIndex();

  // nullopt when absent; kCorruption when the stored value fails its checks.
  Result<std::optional<IndexEntry>> get(const BlockHash& hash) const;
  std::vector<Result<std::optional<IndexEntry>>> multi_get(std::span<const BlockHash> hashes) const;

  // Whether each hash has an entry (a damaged one included), from memory: nullopt until the
  // in-memory set is built (then ask get/multi_get). A yes may be wrong with probability 2^-64
  // per held block (FingerprintSet); a no is exact.
  std::optional<std::vector<bool>> holds(std::span<const BlockHash> hashes) const;
  std::optional<bool> holds(const BlockHash& hash) const;  // one block's, without a vector
  // Entries the in-memory set holds, whether it is built, and whether building it failed (the
  // scan met an error, logged: lookups then ask RocksDB for as long as the index is open).
  size_t held_in_memory() const;
  bool held_set_ready() const { return held_ready_.load(std::memory_order_acquire); }
  bool held_set_failed() const { return held_failed_.load(std::memory_order_acquire); }

  // Accumulates changes for one atomic commit.
  class Batch {
   public:
    Batch();
    ~Batch();
    void put(const BlockHash& hash, const IndexEntry& e);
    // Removes the entry and its segment key.
    void remove(const BlockHash& hash, const IndexEntry& e);
    // Removes only the primary key (for a value that cannot be decoded).
    void remove_primary(const BlockHash& hash);
    void remove_segment_key(uint64_t segment, uint64_t offset);
    void put_segment(const SegmentRecord& s);
    void remove_segment(uint64_t id);
    size_t count() const;

   private:
    friend class SsdIndex;
    std::unique_ptr<rocksdb::WriteBatch> wb_;
    // Fingerprints of primary keys put (true) or removed (false), in order: what the commit
    // changes in the in-memory set.
    std::vector<std::pair<uint64_t, bool>> held_changes_;
  };
  Status commit(Batch& batch, bool sync = false);

  // Every (offset, hash) of a segment, in offset order.
  Status scan_segment(uint64_t segment,
                      const std::function<void(uint64_t offset, const BlockHash& hash)>& fn) const;
  // Every entry; a value that fails to decode is passed as its error.
  Status scan_entries(
      const std::function<void(const BlockHash& hash, const Result<IndexEntry>& entry)>& fn) const;
  // Every segment record; ids whose record fails its checks go to `corrupt_ids`.
  Status load_segments(std::vector<SegmentRecord>& records, std::vector<uint64_t>& corrupt_ids) const;

  // Writes a raw value under a hash's key (tests corrupt the index with it).
  Status put_raw_value(const BlockHash& hash, std::string_view value);

 private:
  explicit SsdIndex(rocksdb::DB* db) : db_(db) {}
  void build_held_set(const std::function<void(SsdIndex&)>& after_snapshot);  // the builder thread
  void apply_held_changes(const std::vector<std::pair<uint64_t, bool>>& changes);
  rocksdb::DB* db_;

  mutable std::shared_mutex held_mu_;  // guards held_ and removed_while_building_
  FingerprintSet held_;
  // Removed while the builder scans: a scan's snapshot may still show them; it must not put them
  // back.
  FingerprintSet removed_while_building_;
  std::atomic<bool> held_ready_{false};
  std::atomic<bool> held_failed_{false};  // the build's scan met an error
  // Under held_mu_: no set is kept (held_in_memory was false, or the build failed), so commits do
  // not grow one that nobody reads.
  bool held_off_ = false;
  std::atomic<bool> stopping_{false};
  std::thread builder_;
};

}  // namespace kvtier
