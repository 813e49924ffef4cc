// AdmissionPolicy: whether a block leaving RAM is worth a write to the SSD. Every spill costs disk
// bandwidth and drive endurance, and most blocks of a one-off prompt are never read again.
//   "all"         every evicted block is written (what kvtier did before policies).
//   "seen-twice"  only a block used at least twice — published and then fetched, or published
//                 again after a miss — as KVBM admits to disk. Uses are counted in a small
//                 count-min sketch (4 x 2^18 four-bit counters, 512 KiB) whose counters halve
//                 after every 2^20 uses, so old popularity fades. A chain's parent is used
//                 whenever its child is, so a parent is never refused where its child is taken.
// Thread-safe.
#pragma once

#include <array>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

#include "base/metrics/metrics.h"
#include "base/status.h"
#include "serialize/block_hash.h"

namespace kvtier {

class AdmissionPolicy {
 public:
  virtual ~AdmissionPolicy() = default;
  virtual std::string_view name() const = 0;
  // A use of the block: it was published, or fetched.
  virtual void used(const BlockHash& hash) = 0;
  // Whether the block, of `bytes`, leaving RAM is written to the SSD.
  virtual bool admit(const BlockHash& hash, uint64_t bytes) = 0;
  virtual void visit_metrics(MetricVisitor&) const {}
};

class AdmitAll final : public AdmissionPolicy {
 public:
  std::string_view name() const override { return "all"; }
  void used(const BlockHash&) override {}
  bool admit(const BlockHash&, uint64_t) override { return true; }
};

class SeenTwiceAdmission final : public AdmissionPolicy {
 public:
  SeenTwiceAdmission();
  std::string_view name() const override { return "seen-twice"; }
  void used(const BlockHash& hash) override;
  bool admit(const BlockHash& hash, uint64_t bytes) override;
  // The sketch's estimate of the block's uses (never below the truth, since the last halving).
  int estimate(const BlockHash& hash);

 private:
  static constexpr int kRows = 4;
  static constexpr int kWidthBits = 18;
  static constexpr uint64_t kHalvingPeriod = 1ull << 20;
  size_t slot(const BlockHash& hash, int row) const;

  std::mutex mu_;  // guards counters_, uses_
  std::vector<uint8_t> counters_;  // kRows x 2^kWidthBits, one 4-bit counter per byte (simple)
  uint64_t uses_ = 0;
};

// "all" or "seen-twice"; with a write budget (bytes a day, 0: none), guarded by a
// WriteBudgetAdmission.
Result<std::unique_ptr<AdmissionPolicy>> make_admission_policy(
    std::string_view name, uint64_t write_budget_bytes_per_day = 0);

}  // namespace kvtier
