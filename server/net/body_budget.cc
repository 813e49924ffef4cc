#include "server/net/body_budget.h"

#include "base/byte_size.h"

namespace kvtier {

BodyBudget::Lease& BodyBudget::Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    release();
    budget_ = other.budget_;
    bytes_ = other.bytes_;
    other.budget_ = nullptr;
  }
  return *this;
}

bool BodyBudget::Lease::grow(uint64_t more, const char* what) {
  if (!budget_) return false;
  std::unique_lock lock(budget_->mu_);
  if (!budget_->try_take(more)) {
    lock.unlock();
    budget_->refused(bytes_ + more, what);
    return false;
  }
  bytes_ += more;
  return true;
}

void BodyBudget::Lease::release() {
  if (budget_ && bytes_ > 0) budget_->give_back(bytes_);
  budget_ = nullptr;
  bytes_ = 0;
}

bool BodyBudget::try_take(uint64_t bytes) {
  if (bytes > capacity_ - held_) return false;
  held_ += bytes;
  return true;
}

void BodyBudget::give_back(uint64_t bytes) {
  {
    std::lock_guard lock(mu_);
    held_ -= bytes;
  }
  returned_.notify_all();
}

std::optional<BodyBudget::Lease> BodyBudget::take(uint64_t bytes, std::chrono::steady_clock::time_point deadline,
                                                  const char* what) {
  std::unique_lock lock(mu_);
  if (bytes <= capacity_ && returned_.wait_until(lock, deadline, [&] { return try_take(bytes); })) {
    return Lease(this, bytes);
  }
  lock.unlock();
  refused(bytes, what);
  return std::nullopt;
}

void BodyBudget::refused(uint64_t bytes, const char* what) {
  refusals_.inc();
  refuse_log_.warn("refused {} of {}: request bodies already hold {} of --max-body-memory {}", what,
                   format_byte_size(bytes), format_byte_size(held()), format_byte_size(capacity_));
}

uint64_t BodyBudget::held() const {
  std::lock_guard lock(mu_);
  return held_;
}

void BodyBudget::visit_metrics(MetricVisitor& v) const {
  v.gauge("kvtier_server_body_bytes_held", "Bytes of request bodies held before they are stored (both doors)", {},
          static_cast<double>(held()));
  v.gauge("kvtier_server_body_bytes_capacity", "--max-body-memory", {}, static_cast<double>(capacity_));
  v.counter("kvtier_server_body_refusals_total", "Requests refused (503): their body did not fit --max-body-memory",
            {}, refusals_.value());
}

}  // namespace kvtier
