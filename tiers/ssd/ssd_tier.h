// SsdTier: blocks on local SSD, the tier that survives restarts. Turned on with --ssd-cache-dir.
//
// DIR/MANIFEST.json  format version, segment size, layouts and namespaces (see ssd_manifest.h)
// DIR/LOCK           held by the one process that has the tier open (see dir_lock.h)
// DIR/segments/      preallocated append-only segment files of framed block documents, each
//                    record padded to 4 KiB and written with O_DIRECT (see spill_writer.h)
// DIR/index/         RocksDB: hash -> record location and checks (see ssd_index.h)
//
// insert() never waits on the disk: it dequantizes and encodes the block on the caller's thread
// and queues it for the writer; a full queue drops the block (counted). Reads verify everything
// they serve (see ssd_reader.h). Blocks still queued are served from memory. On open the index
// is not loaded: entries are checked when read, and only segments whose files are missing or
// shorter than their durable watermark get their entries dropped.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

#include "tiers/ssd/io/dir_lock.h"
#include "tiers/ssd/write/spill_queue.h"
#include "tiers/ssd/write/spill_writer.h"
#include "tiers/ssd/index/ssd_manifest.h"
#include "tiers/ssd/read/ssd_reader.h"
#include "tiers/ssd/ssd_state.h"
#include "tiers/tier.h"

namespace kvtier {

// Thread-safe.
class SsdTier final : public Tier {
 public:
  // Opens (or creates) the cache in options.dir. Layouts recorded in the directory's manifest
  // are added to `layouts`, so blocks of every layout ever written there can be decoded; layouts
  // already in `layouts` are recorded in the manifest.
  // `namespaces`: the namespace accounting to charge (a striped tier shares one over its
  // directories, and reports it itself); null = the tier's own, from options.namespace_quotas.
  static Result<std::unique_ptr<SsdTier>> open(SsdTierOptions options,
                                               std::shared_ptr<LayoutRegistry> layouts,
                                               std::shared_ptr<NamespaceUsage> namespaces = nullptr);
  ~SsdTier() override;

  std::string_view name() const override { return "ssd"; }
  bool reads_wait_on_io() const override { return true; }
  Result<InsertOutcome> insert(BlockRef block) override;
  bool contains(const BlockHash& hash) const override;
  // One index MultiGet for all of them (a prefix's lookup asks hundreds at once).
  std::vector<bool> contains_many(std::span<const BlockHash> hashes) const override;
  Result<BlockRef> read(const BlockRequest& request) override;
  std::vector<Result<BlockRef>> read_many(std::span<const BlockRequest> requests) override;
  bool erase(const BlockHash& hash) override;
  Result<bool> erase_durably(const BlockHash& hash) override;
  // Reclaim is FIFO by segment and ignores pins; pinning is the top tier's business.
  bool pin(const BlockHash& hash) override { return contains(hash); }
  void unpin(const BlockHash&) override {}
  uint64_t capacity_bytes() const override { return state_.options.capacity_bytes; }
  uint64_t used_bytes() const override;
  size_t block_count() const override;
  void visit_metrics(MetricVisitor& visitor) const override;

  // Waits until every block accepted so far is on disk and indexed (or failed, counted).
  void flush();
  // Stops accepting blocks, writes what is queued for up to options.drain_timeout, then closes
  // the index and releases the directory (another process may open it). Afterwards every call
  // answers as an empty tier. Returns the number of queued blocks that were dropped. Idempotent.
  size_t close();

  void set_block_events(std::shared_ptr<BlockEventSink> sink) override;
  // Tells `sink` of every block the index holds now (after a restart, what the directory kept),
  // as blocks whose tokens and parent are not known; ordered with every change of the index.
  Status announce_held(BlockEventSink& sink);

  // Records in the manifest every directory of the striped cache this one belongs to.
  Status record_directories(const std::vector<std::string>& dirs);

  const SsdTierMetrics& metrics() const { return state_.metrics; }
  const SsdTierOptions& options() const { return state_.options; }
  SsdState& state_for_testing() { return state_; }

 private:
  explicit SsdTier(SsdTierOptions options, std::shared_ptr<LayoutRegistry> layouts);
  Status record_layout(const KvLayout& layout, const std::string& namespace_id);
  bool contains_locked(const BlockHash& hash) const;

  SsdState state_;
  // Shared by every call that touches the index; close() takes it exclusively to tear down.
  mutable std::shared_mutex life_mu_;
  std::optional<DirLock> lock_;
  SsdManifest manifest_;
  std::mutex manifest_mu_;  // guards manifest_ updates (new layouts or namespaces)
  SpillQueue queue_;
  std::unique_ptr<SsdReader> reader_;
  std::unique_ptr<SpillWriter> writer_;

  mutable std::mutex pending_mu_;  // guards pending_
  std::unordered_map<BlockHash, SpillItemPtr> pending_;  // accepted, not yet indexed
  std::atomic<uint64_t> next_ticket_{0};
  std::atomic<bool> closed_{false};
  size_t dropped_at_close_ = 0;
  bool owns_namespaces_ = true;  // reports their metrics
  LogThrottle drop_log_;
};

}  // namespace kvtier
