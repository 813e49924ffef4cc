// StripedSsdTier: the SSD tier over one or several directories, one per drive (--ssd-cache-dir
// given more than once). Each directory is a whole SsdTier — its own segments, index, writer and
// reader rings — so drives write and read in parallel, and losing one loses only the blocks it
// held: a directory that cannot be opened is left out (counted, logged) and the rest is served.
//
// A block goes to the directory its hash picks among those up, and is found wherever it is, so
// adding, removing or reordering directories never hides a block that is still on disk. A read
// that spans several directories reads them concurrently. Capacity and the spill queue are split
// evenly; a namespace's quota counts across all directories.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tiers/ssd/ssd_tier.h"

namespace kvtier {

// Thread-safe.
class StripedSsdTier final : public Tier {
 public:
  // Opens options.dirs (or options.dir alone). With one directory any failure to open it is the
  // error; with several, only a configuration error is (a lock held by another process, another
  // segment size or format, data without a manifest, too little capacity per directory); a
  // directory that is unreadable is left out, and one that comes back empty although the others
  // name it is reported lost.
  static Result<std::unique_ptr<StripedSsdTier>> open(SsdTierOptions options,
                                                      std::shared_ptr<LayoutRegistry> layouts);
  ~StripedSsdTier() override;

  std::string_view name() const override { return "ssd"; }
  bool reads_wait_on_io() const override { return true; }
  Result<InsertOutcome> insert(BlockRef block) override;
  bool contains(const BlockHash& hash) const override;
  std::vector<bool> contains_many(std::span<const BlockHash> hashes) const override;
  Result<BlockRef> read(const BlockRequest& request) override;
  std::vector<Result<BlockRef>> read_many(std::span<const BlockRequest> requests) override;
  bool erase(const BlockHash& hash) override;
  Result<bool> erase_durably(const BlockHash& hash) override;
  bool pin(const BlockHash& hash) override { return contains(hash); }
  void unpin(const BlockHash&) override {}
  uint64_t capacity_bytes() const override;
  uint64_t used_bytes() const override;
  size_t block_count() const override;
  void visit_metrics(MetricVisitor& visitor) const override;

  // Waits until every block accepted so far is on disk and indexed (or failed, counted).
  void flush();
  // Closes every directory (see SsdTier::close); returns the queued blocks dropped. Idempotent.
  size_t close();

  void set_erase_fence(std::shared_ptr<EraseFence> fence) override;
  void set_block_events(std::shared_ptr<BlockEventSink> sink) override;
  // SsdTier::announce_held() of every directory.
  Status announce_held(BlockEventSink& sink);
  // The directories that are up, in the order given.
  std::vector<SsdTier*> directories() const;
  // Directories given but not served: unreadable at open, or back empty though the cache named
  // them.
  size_t lost_directories() const { return lost_; }
  // Sum of one metric over the directories that are up.
  uint64_t total(Counter SsdTierMetrics::*metric) const;

 private:
  struct Directory {
    std::string path;               // as given
    std::unique_ptr<SsdTier> tier;  // null: down
    std::string down_reason;
  };
  StripedSsdTier() = default;
  // The directory (index into dirs_) holding `hash`, or -1.
  int holder(const BlockHash& hash) const;
  // holder() of each, asking every directory once for all of them.
  std::vector<int> holders(std::span<const BlockHash> hashes) const;
  // Where a new block of `hash` goes: its hash's pick, or the next one up.
  size_t home(const BlockHash& hash) const;

  std::vector<Directory> dirs_;
  std::shared_ptr<NamespaceUsage> namespaces_;
  size_t lost_ = 0;
};

}  // namespace kvtier
