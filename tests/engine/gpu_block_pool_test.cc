// GpuBlockPool's books, vLLM v1's semantics: least recently used first, cached blocks with no
// references stay findable until reused, all-or-nothing allocation.
#include "engine/blocks/gpu_block_pool.h"

#include <gtest/gtest.h>

#include "tests/engine/engine_test_env.h"
#include "tests/support/test_blocks.h"

namespace kvtier {
namespace {

using testing::gpu;

std::shared_ptr<const KvLayout> layout() {
  return testing::share_layout(KvLayout::uniform("pool-test", 2, 2, 64, 16, DType::kBF16));
}

std::unique_ptr<GpuBlockPool> pool(uint32_t blocks) {
  auto p = GpuBlockPool::create(gpu(), layout(), {blocks, 0});
  EXPECT_TRUE(p.ok()) << p.status().to_string();
  return std::move(p).value();
}

BlockIdentity identity(uint64_t seed) { return testing::identity_for(*layout(), seed); }

// The pool's free list: blocks leave from anywhere and come back at the end, and the front is
// always the one freed longest ago; empty, it says so.
TEST(FreeOrderTest, KeepsTheOrderBlocksWereFreedInWhereverOneLeaves) {
  FreeOrder f(5);
  EXPECT_EQ(f.front(), -1);
  for (int32_t id : {3, 0, 4, 1, 2}) f.push_back(id);
  EXPECT_EQ(f.size(), 5u);
  f.erase(4);  // the middle
  f.erase(3);  // the front
  f.erase(2);  // the back
  EXPECT_FALSE(f.contains(4));
  f.push_back(4);
  f.push_back(3);
  std::vector<int32_t> order;
  while (f.size() > 0) {
    order.push_back(f.front());
    f.pop_front();
  }
  EXPECT_EQ(order, (std::vector<int32_t>{0, 1, 4, 3}));
  EXPECT_EQ(f.front(), -1);
  f.push_back(2);
  EXPECT_EQ(f.front(), 2);
  EXPECT_TRUE(f.contains(2));
}

TEST(GpuBlockPoolTest, AllocationIsAllOrNothingAndLeastRecentlyUsedFirst) {
  auto p = pool(4);
  auto too_many = p->allocate(5);
  ASSERT_FALSE(too_many.ok());
  EXPECT_EQ(too_many.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(p->free_blocks(), 4u);

  auto a = p->allocate(4);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(p->blocks_in_use(), 4u);
  // Freed in the order 2, 0, 3, 1: handed out again in that order.
  for (int32_t id : {a->ids[2], a->ids[0], a->ids[3], a->ids[1]}) p->unref(id);
  auto b = p->allocate(4);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->ids, (std::vector<int32_t>{a->ids[2], a->ids[0], a->ids[3], a->ids[1]}));
  EXPECT_TRUE(b->evicted.empty());
}

TEST(GpuBlockPoolTest, ACachedBlockWithNoReferencesStaysFindableUntilReused) {
  auto p = pool(2);
  auto a = p->allocate(1);
  ASSERT_TRUE(a.ok());
  const int32_t id = a->ids[0];
  const BlockIdentity ident = identity(7);
  EXPECT_FALSE(p->cache(id, ident).has_value());
  p->unref(id);
  EXPECT_EQ(p->find(ident.hash), id);
  EXPECT_EQ(p->cached_blocks(), 1u);
  EXPECT_EQ(p->free_blocks(), 2u);

  // The never-used block goes first; the cached one only when it is the last free one.
  auto b = p->allocate(1);
  ASSERT_TRUE(b.ok());
  EXPECT_NE(b->ids[0], id);
  EXPECT_EQ(p->find(ident.hash), id);
  auto c = p->allocate(1);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->ids[0], id);
  ASSERT_EQ(c->evicted.size(), 1u);
  EXPECT_EQ(c->evicted[0].id, id);
  EXPECT_EQ(c->evicted[0].identity.hash, ident.hash);
  EXPECT_EQ(c->evicted[0].identity.token_ids, ident.token_ids);
  EXPECT_EQ(p->find(ident.hash), -1);
  EXPECT_EQ(p->cached_blocks(), 0u);
}

TEST(GpuBlockPoolTest, AReferencedCachedBlockIsNeverHandedOut) {
  auto p = pool(2);
  auto a = p->allocate(1);
  ASSERT_TRUE(a.ok());
  const BlockIdentity ident = identity(3);
  p->cache(a->ids[0], ident);
  p->unref(a->ids[0]);
  EXPECT_EQ(p->find_and_ref(ident.hash), a->ids[0]);  // out of the free queue again
  EXPECT_EQ(p->free_blocks(), 1u);
  EXPECT_FALSE(p->allocate(2).ok());
  auto b = p->allocate(1);
  ASSERT_TRUE(b.ok());
  EXPECT_NE(b->ids[0], a->ids[0]);
  EXPECT_EQ(p->find(ident.hash), a->ids[0]);
}

TEST(GpuBlockPoolTest, PublishingAHashHeldElsewhereKeepsTheFirstBlock) {
  auto p = pool(2);
  auto a = p->allocate(2);
  ASSERT_TRUE(a.ok());
  const BlockIdentity ident = identity(5);
  EXPECT_FALSE(p->cache(a->ids[0], ident).has_value());
  EXPECT_EQ(p->cache(a->ids[1], ident), a->ids[0]);
  EXPECT_EQ(p->find(ident.hash), a->ids[0]);
  EXPECT_FALSE(p->identity(a->ids[1]).has_value());
  EXPECT_TRUE(p->uncache(ident.hash));
  EXPECT_FALSE(p->uncache(ident.hash));
  EXPECT_EQ(p->find(ident.hash), -1);
}

TEST(GpuBlockPoolTest, SizesItselfFromAByteBudgetAndRefusesOneTooSmall) {
  const uint64_t block = layout()->dense_block_bytes();
  auto p = GpuBlockPool::create(gpu(), layout(), {0, 10 * block + block / 2});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ((*p)->num_blocks(), 10u);
  auto none = GpuBlockPool::create(gpu(), layout(), {0, block - 1});
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("holds no block"), std::string::npos);
  KvLayout q = *layout();
  q.layers[0].quantization = Quantization{8, 64};
  EXPECT_FALSE(GpuBlockPool::create(gpu(), testing::share_layout(q), {4, 0}).ok());
}

}  // namespace
}  // namespace kvtier
