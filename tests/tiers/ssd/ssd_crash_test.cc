// kill -9 in the middle of spilling, 20 times: after each restart every indexed block reads back
// bit-exact or is quarantined, and not one wrong block is served.
#include <gtest/gtest.h>

#include "tests/support/temp_dir.h"
#include "tests/tiers/ssd/ssd_crash_driver.h"

namespace kvtier {
namespace {

TEST(SsdCrashTest, KilledWhileSpillingTwentyTimesServesNoWrongBlock) {
  testing::TempDir dir;
  testing::CrashOptions o;
  o.child = KVTIER_SSD_CRASH_CHILD;
  o.dir = dir.str();
  o.cycles = 20;
  auto totals = testing::run_crash_cycles(o);
  ASSERT_TRUE(totals.ok()) << totals.status().to_string();
  EXPECT_EQ(totals->cycles, 20);
  EXPECT_EQ(totals->wrong, 0u) << "a wrong block was served";
  EXPECT_GT(totals->intact, 20u) << "the children got blocks onto disk";
  EXPECT_EQ(totals->intact + totals->quarantined, totals->entries);
  std::cout << "crash cycles: " << totals->cycles << ", entries checked " << totals->entries
            << ", intact " << totals->intact << ", quarantined " << totals->quarantined
            << ", dropped at recovery " << totals->recovery_dropped << ", wrong " << totals->wrong
            << "\n";
}

}  // namespace
}  // namespace kvtier
