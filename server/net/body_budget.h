// BodyBudget: the bytes of request bodies kvtierd holds before they are stored, across every
// connection of both doors. A PUT's header declares its length before a byte of the body comes,
// and the buffer the block will keep is allocated for that length at once (the KV is received
// straight into it); without a budget, 64 headers with no body behind them held a gigabyte.
// A request takes its bytes from here before it allocates, and gives them back when its body
// is stored or dropped; what does not fit in time is refused (503) and counted. Thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>

#include "base/log.h"
#include "base/metrics/metrics.h"

namespace kvtier {

class BodyBudget {
 public:
  // Bytes held by one request; given back when it is destroyed. Move-only.
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& other) noexcept : budget_(other.budget_), bytes_(other.bytes_) { other.budget_ = nullptr; }
    Lease& operator=(Lease&& other) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() { release(); }

    uint64_t bytes() const { return bytes_; }
    // Takes `more` bytes without waiting (a body read in pieces); false (counted and logged with
    // `what`) when they do not fit.
    bool grow(uint64_t more, const char* what);
    void release();

   private:
    friend class BodyBudget;
    Lease(BodyBudget* budget, uint64_t bytes) : budget_(budget), bytes_(bytes) {}
    BodyBudget* budget_ = nullptr;
    uint64_t bytes_ = 0;
  };

  explicit BodyBudget(uint64_t capacity_bytes) : capacity_(capacity_bytes) {}

  // `bytes`, waiting until `deadline` for others to give theirs back; nullopt (counted and
  // logged once per interval with `what`) when they do not come, or never could (past capacity).
  std::optional<Lease> take(uint64_t bytes, std::chrono::steady_clock::time_point deadline, const char* what);
  // An empty lease, to grow() as a body of unknown length arrives.
  Lease empty() { return Lease(this, 0); }

  uint64_t capacity() const { return capacity_; }
  uint64_t held() const;
  uint64_t refusals() const { return refusals_.value(); }
  void visit_metrics(MetricVisitor& visitor) const;

 private:
  bool try_take(uint64_t bytes);  // mu_ held
  void give_back(uint64_t bytes);
  void refused(uint64_t bytes, const char* what);

  const uint64_t capacity_;
  mutable std::mutex mu_;  // guards held_
  std::condition_variable returned_;
  uint64_t held_ = 0;
  Counter refusals_;
  LogThrottle refuse_log_;
};

}  // namespace kvtier
