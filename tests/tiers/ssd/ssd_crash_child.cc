// The process the kill -9 experiment kills: opens the SSD tier in argv[1] and spills blocks
// seeded argv[2], argv[2]+1, ... as fast as the writer takes them, until it is killed.
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "base/log.h"
#include "tests/tiers/ssd/ssd_crash_driver.h"
#include "tests/tiers/ssd/ssd_test_env.h"
#include "tiers/ssd/ssd_tier.h"

using namespace kvtier;

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: ssd_crash_child DIR FIRST_SEED\n";
    return 2;
  }
  spdlog::set_level(spdlog::level::warn);
  auto layouts = std::make_shared<LayoutRegistry>();
  (void)layouts->add(*testing::crash_layout());
  auto tier = SsdTier::open(testing::crash_tier_options(argv[1]), layouts);
  if (!tier.ok()) {
    std::cerr << tier.status().to_string() << "\n";
    return 1;
  }
  // Tell the parent the tier is open: its kill timer starts now, not during start-up.
  std::cout << "spilling" << std::endl;
  for (uint64_t seed = std::strtoull(argv[2], nullptr, 10);; ++seed) {
    BlockRef b = testing::seeded_block(testing::crash_layout(), seed);
    while (!(*tier)->insert(b).ok()) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}
