// The benchmarks' paired ratio: each round's reference over its subject, so a host that slows down
// between rounds moves both sides of a pair and the ratio stays where it was.
#include "bench/harness/bench_report.h"

#include <gtest/gtest.h>

namespace kvtier::bench {
namespace {

TEST(PairedRatioTest, ADriftingHostCancelsOutWithinEachPair) {
  // The subject runs at 0.8 of the reference every round while the host slows down 4x.
  const std::vector<double> reference{1.0, 2.0, 4.0, 3.0, 1.5};
  std::vector<double> subject;
  for (double r : reference) subject.push_back(r / 0.8);
  const PairedRatio p = paired_ratio(reference, subject);
  EXPECT_EQ(p.pairs, 5u);
  EXPECT_DOUBLE_EQ(p.median, 0.8);
  EXPECT_DOUBLE_EQ(p.min, 0.8);
  EXPECT_DOUBLE_EQ(p.max, 0.8);
  // A round where only the reference was slowed (the disk busy while fio ran) is one pair out of
  // five: the median keeps to the others.
  std::vector<double> noisy_reference = reference;
  noisy_reference[1] *= 3;
  const PairedRatio q = paired_ratio(noisy_reference, subject);
  EXPECT_DOUBLE_EQ(q.median, 0.8);
  EXPECT_DOUBLE_EQ(q.max, 2.4);
}

TEST(PairedRatioTest, SpreadAndTextAndRoundsWithoutATime) {
  const PairedRatio p = paired_ratio({1.0, 1.0, 1.0, 0.0}, {2.0, 1.0, 1.25, 1.0});
  EXPECT_EQ(p.pairs, 3u) << "a round without a reference time is left out";
  EXPECT_DOUBLE_EQ(p.median, 0.8);
  EXPECT_DOUBLE_EQ(p.min, 0.5);
  EXPECT_DOUBLE_EQ(p.max, 1.0);
  EXPECT_EQ(p.text(), "0.80 [0.50-1.00]");
  EXPECT_EQ(paired_ratio({}, {}).pairs, 0u);
}

TEST(PairedRatioTest, FromRatesIsTheSubjectsRateOverTheReferences) {
  const PairedRatio p = paired_rate_ratio({2e9, 1e9, 4e9}, {1.6e9, 0.8e9, 3.2e9});  // bytes/s
  EXPECT_DOUBLE_EQ(p.median, 0.8);
  EXPECT_DOUBLE_EQ(p.min, 0.8);
  EXPECT_EQ(p.pairs, 3u);
  EXPECT_EQ(paired_rate_ratio({0, 1e9}, {1e9, 1e9}).pairs, 1u) << "a reference that did not run is left out";
}

}  // namespace
}  // namespace kvtier::bench
