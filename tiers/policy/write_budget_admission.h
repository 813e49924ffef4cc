// WriteBudgetAdmission: an endurance guard in front of an SSD admission rule. Drives are warranted
// for so many drive-writes per day; --ssd-write-budget says how many bytes a day the SSD tier may
// write. The budget fills a bucket continuously (at bytes_per_day / 86400 a second) that holds at
// most an hour of it, so a quiet night does not buy a morning of unbounded writes. The rule under
// it decides alone while the bucket is more than half full; below that admission tightens — a
// block must also have been used twice (published, fetched), below a quarter three times — and an
// empty bucket admits nothing. Every refusal for the budget is counted.
// Thread-safe.
#pragma once

#include <functional>
#include <memory>
#include <mutex>

#include "base/metrics/metrics.h"
#include "tiers/policy/admission_policy.h"

namespace kvtier {

class WriteBudgetAdmission final : public AdmissionPolicy {
 public:
  using Clock = std::function<double()>;  // seconds on a steady clock
  static constexpr double kBucketSeconds = 3600;

  WriteBudgetAdmission(std::unique_ptr<AdmissionPolicy> inner, uint64_t bytes_per_day,
                       Clock clock = {});

  std::string_view name() const override { return name_; }
  void used(const BlockHash& hash) override;
  bool admit(const BlockHash& hash, uint64_t bytes) override;
  void visit_metrics(MetricVisitor& v) const override;

  // Uses a block must have had to be admitted at the bucket's present level (1: the rule alone;
  // 0 means none is admitted).
  int uses_required() const;
  double bucket_bytes() const;
  uint64_t refused_for_budget() const { return refused_.value(); }

 private:
  void refill_locked() const;
  int uses_required_locked() const;

  const std::unique_ptr<AdmissionPolicy> inner_;
  const std::string name_;
  const uint64_t bytes_per_day_;
  const double bytes_per_second_;
  const double capacity_;
  const Clock clock_;
  // Counts uses: the rule's own sketch when the rule is seen-twice (one sketch, one lock per use
  // on the data path), else one of its own whose rule is not consulted.
  std::unique_ptr<SeenTwiceAdmission> own_uses_;
  SeenTwiceAdmission* uses_;
  mutable std::mutex mu_;    // guards bucket_, last_
  mutable double bucket_;
  mutable double last_;
  Counter refused_;
  Counter admitted_bytes_;
};

}  // namespace kvtier
