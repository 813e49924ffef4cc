// SsdTierTest: the fixture of the SSD tier's tests — a tier of small segments in a temporary
// directory, layouts of every dtype, and ways to reach a block's record on disk.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "tests/tiers/ssd/ssd_test_env.h"

namespace kvtier::testing {

class SsdTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    layouts_ = std::make_shared<LayoutRegistry>();
    for (DType d : {DType::kF32, DType::kF16, DType::kBF16}) {
      by_dtype_.push_back(*layouts_->add(KvLayout::uniform(
          std::string("t-") + std::string(dtype_name(d)), 2, 2, 64, 16, d)));
    }
  }
  std::unique_ptr<SsdTier> open(SsdTierOptions o) {
    auto t = SsdTier::open(std::move(o), layouts_);
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    return t.ok() ? std::move(t).value() : nullptr;
  }
  std::unique_ptr<SsdTier> open() { return open(small_ssd_options(dir_.str())); }
  // How many of `blocks` `t` serves, each checked byte for byte against what was written.
  size_t served_exact(SsdTier& t, const std::vector<BlockRef>& blocks) {
    size_t served = 0;
    for (const auto& b : blocks) {
      auto got = t.read(request_for(b));
      if (!got.ok()) continue;
      ++served;
      EXPECT_TRUE(testing::same_bytes(**got, *b));
    }
    return served;
  }
  // The record of `b` on disk.
  IndexEntry entry_of(SsdTier& t, const BlockRef& b) {
    auto e = t.state_for_testing().index->get(b->hash());
    EXPECT_TRUE(e.ok() && e->has_value());
    return **e;
  }
  std::string segment_path(SsdTier& t, uint64_t id) { return t.state_for_testing().segment_path(id); }
  // Flips bits (`mask`) of one byte in the middle of a record, inside its tensor data.
  void flip_byte_inside(SsdTier& t, const IndexEntry& e, uint8_t mask) {
    const int fd = ::open(segment_path(t, e.segment).c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    uint8_t byte;
    const off_t at = static_cast<off_t>(e.offset + e.length / 2);
    ASSERT_EQ(::pread(fd, &byte, 1, at), 1);
    byte ^= mask;
    ASSERT_EQ(::pwrite(fd, &byte, 1, at), 1);
    ::close(fd);
  }

  TempDir dir_;
  std::shared_ptr<LayoutRegistry> layouts_;
  std::vector<std::shared_ptr<const KvLayout>> by_dtype_;
};

}  // namespace kvtier::testing
