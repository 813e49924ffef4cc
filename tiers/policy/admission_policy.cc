#include "tiers/policy/admission_policy.h"

#include <algorithm>
#include <cstring>

#include "tiers/policy/write_budget_admission.h"

namespace kvtier {

SeenTwiceAdmission::SeenTwiceAdmission() : counters_(static_cast<size_t>(kRows) << kWidthBits, 0) {}

size_t SeenTwiceAdmission::slot(const BlockHash& hash, int row) const {
  // The hash is already uniform; its first 16 bytes (all an xxh3 hash has) give the rows by
  // double hashing: h0 + row * h1.
  uint64_t h0, h1;
  std::memcpy(&h0, hash.bytes.data(), sizeof(h0));
  std::memcpy(&h1, hash.bytes.data() + 8, sizeof(h1));
  const uint64_t v = h0 + static_cast<uint64_t>(row) * (h1 | 1);
  return (static_cast<size_t>(row) << kWidthBits) + (v & ((1u << kWidthBits) - 1));
}

void SeenTwiceAdmission::used(const BlockHash& hash) {
  std::lock_guard lock(mu_);
  for (int r = 0; r < kRows; ++r) {
    uint8_t& c = counters_[slot(hash, r)];
    if (c < 15) ++c;
  }
  if (++uses_ % kHalvingPeriod == 0) {
    for (uint8_t& c : counters_) c >>= 1;
  }
}

int SeenTwiceAdmission::estimate(const BlockHash& hash) {
  std::lock_guard lock(mu_);
  int e = 15;
  for (int r = 0; r < kRows; ++r) e = std::min<int>(e, counters_[slot(hash, r)]);
  return e;
}

bool SeenTwiceAdmission::admit(const BlockHash& hash, uint64_t) { return estimate(hash) >= 2; }

Result<std::unique_ptr<AdmissionPolicy>> make_admission_policy(
    std::string_view name, uint64_t write_budget_bytes_per_day) {
  std::unique_ptr<AdmissionPolicy> rule;
  if (name == "all") {
    rule = std::make_unique<AdmitAll>();
  } else if (name == "seen-twice") {
    rule = std::make_unique<SeenTwiceAdmission>();
  } else {
    return invalid_argument("unknown SSD admission '" + std::string(name) +
                            "' (known: all, seen-twice)");
  }
  if (write_budget_bytes_per_day == 0) return rule;
  return std::unique_ptr<AdmissionPolicy>(
      std::make_unique<WriteBudgetAdmission>(std::move(rule), write_budget_bytes_per_day));
}

}  // namespace kvtier
