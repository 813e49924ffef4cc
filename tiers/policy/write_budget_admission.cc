#include "tiers/policy/write_budget_admission.h"

#include <algorithm>
#include <chrono>

namespace kvtier {
namespace {

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

WriteBudgetAdmission::WriteBudgetAdmission(std::unique_ptr<AdmissionPolicy> inner,
                                           uint64_t bytes_per_day, Clock clock)
    : inner_(std::move(inner)),
      name_(std::string(inner_->name()) + "+write-budget"),
      bytes_per_day_(bytes_per_day),
      bytes_per_second_(static_cast<double>(bytes_per_day) / 86400.0),
      capacity_(bytes_per_second_ * kBucketSeconds),
      clock_(clock ? std::move(clock) : Clock(steady_seconds)),
      own_uses_(dynamic_cast<SeenTwiceAdmission*>(inner_.get())
                    ? nullptr
                    : std::make_unique<SeenTwiceAdmission>()),
      uses_(own_uses_ ? own_uses_.get() : static_cast<SeenTwiceAdmission*>(inner_.get())),
      // A start with a full hour: a restart is not a reason to refuse the first writes.
      bucket_(capacity_),
      last_(clock_()) {}

void WriteBudgetAdmission::used(const BlockHash& hash) {
  inner_->used(hash);
  if (own_uses_) own_uses_->used(hash);
}

void WriteBudgetAdmission::refill_locked() const {
  const double now = clock_();
  bucket_ = std::min(capacity_, bucket_ + std::max(0.0, now - last_) * bytes_per_second_);
  last_ = now;
}

int WriteBudgetAdmission::uses_required_locked() const {
  if (bucket_ <= 0) return 0;
  if (bucket_ > capacity_ / 2) return 1;
  return bucket_ > capacity_ / 4 ? 2 : 3;
}

int WriteBudgetAdmission::uses_required() const {
  std::lock_guard lock(mu_);
  refill_locked();
  return uses_required_locked();
}

double WriteBudgetAdmission::bucket_bytes() const {
  std::lock_guard lock(mu_);
  refill_locked();
  return bucket_;
}

bool WriteBudgetAdmission::admit(const BlockHash& hash, uint64_t bytes) {
  if (!inner_->admit(hash, bytes)) return false;  // the rule's refusal, counted by the cache
  // Estimated outside the lock: the sketch has its own.
  const int uses = uses_->estimate(hash);
  {
    std::lock_guard lock(mu_);
    refill_locked();
    const int required = uses_required_locked();
    if (required > 0 && uses >= required) {
      bucket_ -= static_cast<double>(bytes);  // may go below zero once: the next refills pay it
      admitted_bytes_.inc(bytes);
      return true;
    }
  }
  refused_.inc();
  return false;
}

void WriteBudgetAdmission::visit_metrics(MetricVisitor& v) const {
  inner_->visit_metrics(v);
  v.gauge("kvtier_ssd_write_budget_bytes_per_day",
          "The SSD tier's write budget (--ssd-write-budget)", {},
          static_cast<double>(bytes_per_day_));
  v.gauge("kvtier_ssd_write_budget_available_bytes",
          "Bytes the SSD tier may write now (a bucket of at most an hour of the budget); admission "
          "tightens "
          "below half of it",
          {}, bucket_bytes());
  v.gauge("kvtier_ssd_write_budget_uses_required",
          "Uses a block leaving RAM needs to be written at the budget's present level (1: the "
          "admission rule "
          "alone, 0: nothing written)",
          {}, uses_required());
  v.counter("kvtier_ssd_admission_refused_total",
            "Blocks leaving RAM not written to the SSD, by reason", {{"reason", "write_budget"}},
            refused_.value());
  v.counter("kvtier_ssd_write_budget_admitted_bytes_total",
            "Bytes admitted to the SSD against the write budget", {}, admitted_bytes_.value());
}

}  // namespace kvtier
