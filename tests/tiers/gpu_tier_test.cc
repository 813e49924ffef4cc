// GpuTier on a real Vulkan device: blocks of every dtype go up and come back bit-exact, evictions
// hand the exact bytes down, pins hold blocks in place, and refusals are counted.
#include "tiers/gpu_tier.h"

#include <set>

#include <gtest/gtest.h>

#include "base/memory/large_buffer_cache.h"

#include "tests/engine/engine_test_env.h"
#include "tests/support/held_blocks.h"
#include "tests/support/test_blocks.h"

namespace kvtier {
namespace {

using testing::gpu;

// Layers of each dtype, so one block covers F32, F16 and BF16: 32 KiB a block with 2 KV heads of
// 64 (in host memory the GPU imports, where it can), 8 KiB with 1 of 32 (under
// kLargeBufferThreshold: staged).
std::shared_ptr<const KvLayout> mixed_layout(uint32_t kv_heads = 2, uint32_t head_dim = 64) {
  const std::string name = "gpu-tier-test-" + std::to_string(kv_heads) + "x" + std::to_string(head_dim);
  KvLayout l = KvLayout::uniform(name, 3, kv_heads, head_dim, 16, DType::kF32);
  l.layers[1].dtype = DType::kF16;
  l.layers[2].dtype = DType::kBF16;
  return testing::share_layout(l);
}

struct Fixture {
  std::shared_ptr<const KvLayout> layout = mixed_layout();
  std::unique_ptr<GpuBlockPool> pool;
  std::unique_ptr<GpuTier> tier;
  std::vector<BlockRef> evicted;

  explicit Fixture(uint32_t blocks, std::shared_ptr<const KvLayout> l = mixed_layout()) : layout(std::move(l)) {
    pool = std::move(GpuBlockPool::create(gpu(), layout, {blocks, 0})).value();
    tier = std::move(GpuTier::create(gpu(), *pool)).value();
    tier->set_eviction_sink([this](BlockRef b) { evicted.push_back(std::move(b)); });
  }
  BlockRef block(uint64_t seed, testing::Values v = testing::Values::kWithSpecials) {
    return std::make_shared<const Block>(testing::make_block(layout, seed, v));
  }
};

BlockRequest request_for(const BlockRef& b) { return {b->hash(), b->identity().token_ids}; }

// Uploads `blocks` in one batch, reads them back in one batch, compares every byte and token.
void expect_batch_round_trip(Fixture& f, const std::vector<BlockRef>& blocks) {
  for (auto& o : f.tier->insert_many(blocks)) ASSERT_TRUE(o.ok() && *o == InsertOutcome::kInserted);
  std::vector<BlockRequest> reqs;
  for (auto& b : blocks) reqs.push_back(request_for(b));
  auto got = f.tier->read_many(reqs);
  for (size_t i = 0; i < blocks.size(); ++i) {
    ASSERT_TRUE(got[i].ok()) << got[i].status().to_string();
    ASSERT_TRUE(testing::same_bytes(**got[i], *blocks[i])) << "block " << i;
    ASSERT_EQ((*got[i])->identity().token_ids, blocks[i]->identity().token_ids);
  }
}

TEST(GpuTierTest, BlocksOfEveryDtypeRoundTripBitExactInOneBatch) {
  Fixture f(8);
  std::vector<BlockRef> blocks;
  for (uint64_t s = 1; s <= 5; ++s) blocks.push_back(f.block(s));
  expect_batch_round_trip(f, blocks);
  EXPECT_EQ(f.tier->metrics().uploads.value(), 5u);
  EXPECT_EQ(f.tier->block_count(), 5u);
  EXPECT_EQ(f.tier->metrics().downloads.value(), 5u);
  // Again: already present, nothing uploaded.
  EXPECT_EQ(*f.tier->insert(blocks[0]), InsertOutcome::kAlreadyPresent);
  EXPECT_EQ(f.tier->metrics().uploads.value(), 5u);
}

// A block the pool evicts is in no tier only if it is nowhere: until the tier below has taken it,
// the GPU tier still answers for it (contains, probe, read: the bytes it saved), and a delete
// meanwhile finds it here.
TEST(GpuTierTest, AnEvictedBlockIsStillFoundHereUntilTheTierBelowHasIt) {
  Fixture f(2);
  const BlockRef first = f.block(1);
  ASSERT_TRUE(f.tier->insert(first).ok());
  ASSERT_TRUE(f.tier->insert(f.block(2)).ok());
  bool seen = false;
  f.tier->set_eviction_sink([&](BlockRef b) {
    if (b->hash() != first->hash()) return;
    seen = true;
    EXPECT_TRUE(f.tier->contains(b->hash()));
    EXPECT_EQ(f.tier->contains_many(std::vector<BlockHash>{b->hash()}), std::vector<bool>{true});
    EXPECT_EQ(f.tier->probe(request_for(first)), Tier::Presence::kSameTokens);
    auto got = f.tier->read(request_for(first));
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_TRUE(testing::same_bytes(**got, *first));
  });
  ASSERT_TRUE(f.tier->insert(f.block(3)).ok());  // evicts block 1, the least recently used
  EXPECT_TRUE(seen);
  EXPECT_FALSE(f.tier->contains(first->hash())) << "gone once the sink returned";
}

// Staged blocks lie side by side in the host staging buffer and in device staging, so a batch
// crosses in one copy region each way (one region per block cost the NVIDIA driver ~2 ms per 447
// blocks: a bench caught it, this catches it first). Uploads that read in place need none.
TEST(GpuTierTest, StagedBlocksOfABatchCrossInOneCopyRegion) {
  Fixture f(8, mixed_layout(1, 32));
  std::vector<BlockRef> blocks;
  for (uint64_t s = 1; s <= 6; ++s) blocks.push_back(f.block(s));
  ASSERT_LT(f.layout->dense_block_bytes(), kLargeBufferThreshold) << "the smallest blocks are staged";
  expect_batch_round_trip(f, blocks);
  EXPECT_EQ(f.tier->metrics().uploads.value(), 6u);
  EXPECT_EQ(f.tier->metrics().downloads.value(), 6u);
  EXPECT_EQ(f.tier->metrics().copy_regions.value(), f.tier->reads_in_place() ? 1u : 2u)
      << "one region down, and one up unless uploads read in place";
}

// Blocks in imported host memory go up in one launch that reads each where it lies: scattered
// over the chunks (every other block of a batch, so no two are adjacent) they need no copy region
// and no CPU copy, and land bit-exact.
TEST(GpuTierTest, UploadsReadScatteredHostBlocksInPlace) {
  Fixture f(64);
  if (!f.tier->reads_in_place()) GTEST_SKIP() << "the device cannot read imported host memory";
  std::vector<BlockRef> all, every_other;
  for (uint64_t s = 1; s <= 40; ++s) all.push_back(f.block(s, testing::Values::kRandom));
  for (size_t i = 0; i < all.size(); i += 2) every_other.push_back(all[i]);
  ASSERT_GE(f.layout->dense_block_bytes(), kLargeBufferThreshold) << "blocks must lie in importable chunks";
  const uint64_t regions = f.tier->metrics().copy_regions.value();
  for (auto& o : f.tier->insert_many(every_other)) ASSERT_TRUE(o.ok() && *o == InsertOutcome::kInserted);
  EXPECT_EQ(f.tier->metrics().copy_regions.value(), regions) << "no copy region on the way up";
  EXPECT_EQ(f.tier->metrics().direct_up.value(), every_other.size());
  std::vector<BlockRequest> reqs;
  for (auto& b : every_other) reqs.push_back(request_for(b));
  auto got = f.tier->read_many(reqs);
  for (size_t i = 0; i < every_other.size(); ++i) {
    ASSERT_TRUE(got[i].ok()) << got[i].status().to_string();
    ASSERT_TRUE(std::equal(every_other[i]->data().begin(), every_other[i]->data().end(), (*got[i])->data().begin()))
        << "block " << i;
  }
}

// Batches of 16 MiB and more are copied to and from the staging buffer by several threads, each
// taking every n-th block: every block must still land in its own slot.
// A block decoded from an SSD record is adopted where its tensors lie: 8-byte aligned, not 16. Read
// in place it must still land exact (16-byte loads from such an address gave other bytes on the
// H100, lavapipe did not mind).
TEST(GpuTierTest, BlocksAdoptedAtAnEightByteOffsetGoUpExact) {
  Fixture f(16);
  std::vector<BlockRef> blocks;
  for (uint64_t s = 1; s <= 6; ++s) {
    const Block plain = testing::make_block(f.layout, s, testing::Values::kRandom);
    const size_t bytes = plain.data().size();
    AlignedBuffer storage(bytes + 64);
    std::memcpy(storage.data() + 8, plain.data().data(), bytes);
    Block adopted = Block::adopt_dense(f.layout, plain.identity(), std::move(storage), 8);
    ASSERT_EQ(reinterpret_cast<uintptr_t>(adopted.data().data()) % 16, 8u);
    blocks.push_back(std::make_shared<const Block>(std::move(adopted)));
  }
  expect_batch_round_trip(f, blocks);
  if (f.tier->reads_in_place()) {
    EXPECT_EQ(f.tier->metrics().direct_up.value(), blocks.size()) << "read in place";
  }
}

TEST(GpuTierTest, LargeBatchesCopiedByManyThreadsRoundTripBitExact) {
  Fixture f(600);
  std::vector<BlockRef> blocks;
  for (uint64_t s = 1; s <= 520; ++s) blocks.push_back(f.block(s, testing::Values::kRandom));
  ASSERT_GE(blocks.size() * f.layout->dense_block_bytes(), 16u << 20);
  expect_batch_round_trip(f, blocks);
}

TEST(GpuTierTest, EvictionHandsTheExactBytesDownLeastRecentlyUsedFirst) {
  Fixture f(3);
  std::vector<BlockRef> blocks;
  for (uint64_t s = 1; s <= 5; ++s) {
    blocks.push_back(f.block(s));
    ASSERT_TRUE(f.tier->insert(blocks.back()).ok());
  }
  ASSERT_EQ(f.evicted.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(f.evicted[i]->hash(), blocks[i]->hash());
    EXPECT_TRUE(testing::same_bytes(*f.evicted[i], *blocks[i])) << i;
    EXPECT_FALSE(f.tier->contains(blocks[i]->hash()));
  }
  for (size_t i = 2; i < 5; ++i) EXPECT_TRUE(f.tier->contains(blocks[i]->hash()));
  EXPECT_EQ(f.tier->metrics().evictions.value(), 2u);
}

TEST(GpuTierTest, PinnedBlocksStayAndAFullPoolRefusesWithACountedError) {
  Fixture f(2);
  auto a = f.block(1), b = f.block(2), c = f.block(3);
  ASSERT_TRUE(f.tier->insert(a).ok());
  ASSERT_TRUE(f.tier->insert(b).ok());
  ASSERT_TRUE(f.tier->pin(a->hash()));
  ASSERT_TRUE(f.tier->pin(b->hash()));
  const auto slot = f.tier->device_slot(a->hash());
  ASSERT_TRUE(slot.has_value());
  auto r = f.tier->insert(c);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(f.tier->metrics().rejected.value(), 1u);
  EXPECT_TRUE(f.evicted.empty());
  EXPECT_EQ(f.tier->device_slot(a->hash()), slot);

  f.tier->unpin(b->hash());
  ASSERT_TRUE(f.tier->insert(c).ok());
  ASSERT_EQ(f.evicted.size(), 1u);
  EXPECT_EQ(f.evicted[0]->hash(), b->hash());
  f.tier->unpin(a->hash());
}

// pin_many answers a prefix in one pass: each present block pinned with its slot and whether it
// holds the request's tokens, an absent one not pinned; its pins nest with pin()'s and hold
// blocks against eviction until unpin_pinned gives them back.
TEST(GpuTierTest, PinManyPinsAPrefixWithSlotsAndTokenChecksUntilUnpinPinned) {
  Fixture f(3);
  auto a = f.block(1, testing::Values::kRandom), b = f.block(2, testing::Values::kRandom);
  auto absent = f.block(3);
  ASSERT_TRUE(f.tier->insert(a).ok());
  ASSERT_TRUE(f.tier->insert(b).ok());
  std::vector<uint32_t> other_tokens = b->identity().token_ids;
  other_tokens[0] ^= 1;
  const std::vector<BlockRequest> reqs{request_for(a), {b->hash(), other_tokens}, request_for(absent)};
  const auto pins = f.tier->pin_many(reqs);
  ASSERT_EQ(pins.size(), 3u);
  EXPECT_TRUE(pins[0].pinned);
  EXPECT_EQ(pins[0].slot, f.tier->device_slot(a->hash()));
  EXPECT_EQ(pins[0].presence, Tier::Presence::kSameTokens);
  EXPECT_TRUE(pins[1].pinned);
  EXPECT_EQ(pins[1].slot, f.tier->device_slot(b->hash()));
  EXPECT_EQ(pins[1].presence, Tier::Presence::kDifferentTokens);
  EXPECT_FALSE(pins[2].pinned);
  EXPECT_FALSE(pins[2].slot.has_value());

  // Both pinned (a twice): new blocks evict around them.
  ASSERT_TRUE(f.tier->pin(a->hash()));
  EXPECT_EQ(f.pool->free_blocks(), 1u);
  ASSERT_TRUE(f.tier->insert(f.block(4)).ok());
  ASSERT_TRUE(f.tier->insert(f.block(5)).ok());
  ASSERT_EQ(f.evicted.size(), 1u);
  EXPECT_EQ(f.evicted[0]->hash(), f.block(4)->hash());
  const std::vector<BlockHash> all{a->hash(), b->hash(), absent->hash()};
  EXPECT_EQ(f.tier->contains_many(all), (std::vector<bool>{true, true, false}));

  f.tier->unpin_pinned(all, std::vector<int32_t>{*pins[0].slot, *pins[1].slot, -1});
  EXPECT_EQ(f.pool->free_blocks(), 2u);  // b free again, beside block 5; a still holds pin()'s pin
  f.tier->unpin(a->hash());
  EXPECT_EQ(f.pool->free_blocks(), 3u);
}

// pin_many's pins are given back by slot: the pinned block itself, even when its hash was erased
// and stored again (in another block) while it was pinned, and nothing else.
TEST(GpuTierTest, UnpinPinnedGivesBackThePinnedBlockAfterItsHashWasStoredElsewhere) {
  Fixture f(3);
  auto a = f.block(1, testing::Values::kRandom);
  ASSERT_TRUE(f.tier->insert(a).ok());
  const auto pins = f.tier->pin_many(std::vector<BlockRequest>{request_for(a)});
  ASSERT_TRUE(pins[0].pinned && pins[0].slot);
  const int32_t first = *pins[0].slot;
  EXPECT_EQ(f.pool->free_blocks(), 2u);
  ASSERT_TRUE(f.tier->erase(a->hash()));  // the pinned block stays where it is, no longer cached
  ASSERT_TRUE(f.tier->insert(a).ok());    // so the hash is stored in another block
  const auto second = f.tier->device_slot(a->hash());
  ASSERT_TRUE(second.has_value());
  EXPECT_NE(*second, first);
  ASSERT_TRUE(f.tier->pin(a->hash()));  // the new block, pinned by hash
  EXPECT_EQ(f.pool->free_blocks(), 1u);

  f.tier->unpin_pinned(std::vector<BlockHash>{a->hash()}, std::vector<int32_t>{first});
  EXPECT_EQ(f.pool->free_blocks(), 2u);  // the first block, not the one pin() holds
  // Two new blocks take the first block and the third, not the one pin() holds.
  ASSERT_TRUE(f.tier->insert(f.block(2)).ok());
  ASSERT_TRUE(f.tier->insert(f.block(3)).ok());
  EXPECT_TRUE(f.tier->contains(a->hash()));
  EXPECT_EQ(f.tier->device_slot(a->hash()), second);
  f.tier->unpin(a->hash());
  EXPECT_EQ(f.pool->free_blocks(), 3u);
}

TEST(GpuTierTest, BlockEventsReplayToExactlyTheBlocksThePoolCaches) {
  Fixture f(4);
  auto events = std::make_shared<testing::HeldBlocks>();
  f.tier->set_block_events(events);
  std::vector<BlockRef> blocks;
  for (uint64_t seed = 1; seed <= 7; ++seed) {
    blocks.push_back(f.block(seed));
    ASSERT_TRUE(f.tier->insert(blocks.back()).ok());
  }
  EXPECT_TRUE(f.tier->erase(blocks[6]->hash()));
  std::set<BlockHash> cached;
  for (const BlockRef& b : blocks) {
    if (f.pool->find(b->hash()) >= 0) cached.insert(b->hash());
  }
  EXPECT_EQ(cached.size(), 3u) << "four slots, three evicted to make room, the last erased";
  EXPECT_EQ(events->held, cached);
  EXPECT_EQ(events->stores, 7);
}

TEST(GpuTierTest, ABlockOfAnotherLayoutIsRefusedAndNothingChanges) {
  Fixture f(2);
  auto other = testing::share_layout(KvLayout::uniform("other", 3, 2, 64, 16, DType::kF16));
  auto foreign = std::make_shared<const Block>(testing::make_block(other, 9));
  auto r = f.tier->insert(foreign);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f.tier->metrics().rejected.value(), 1u);
  EXPECT_EQ(f.tier->block_count(), 0u);
  EXPECT_EQ(f.pool->free_blocks(), 2u);
}

TEST(GpuTierTest, ReadsCheckTokensAndEraseForgetsTheBlock) {
  Fixture f(2);
  auto a = f.block(1, testing::Values::kRandom);
  ASSERT_TRUE(f.tier->insert(a).ok());
  std::vector<uint32_t> other_tokens = a->identity().token_ids;
  other_tokens[0] ^= 1;
  const BlockRequest wrong{a->hash(), other_tokens};
  EXPECT_EQ(f.tier->probe(wrong), Tier::Presence::kDifferentTokens);
  EXPECT_FALSE(f.tier->read(wrong).ok());
  EXPECT_EQ(f.tier->probe(request_for(a)), Tier::Presence::kSameTokens);
  EXPECT_TRUE(f.tier->erase(a->hash()));
  EXPECT_FALSE(f.tier->contains(a->hash()));
  EXPECT_FALSE(f.tier->read(request_for(a)).ok());
  EXPECT_FALSE(f.tier->erase(a->hash()));
}

TEST(GpuTierTest, QuantizedHostBlocksGoUpDense) {
  Fixture f(2);
  auto a = f.block(4, testing::Values::kRandom);
  auto q = a->quantized(Quantization{8, 64});
  ASSERT_TRUE(q.ok());
  auto quantized = std::make_shared<const Block>(std::move(q).value());
  ASSERT_TRUE(f.tier->insert(quantized).ok());
  auto got = f.tier->read(request_for(a));
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(testing::same_bytes(**got, quantized->dequantized()));
}

// Blocks of 16 KiB and more live in host memory the GPU imports: they go up and come down by DMA
// from and into where they lie (no CPU copy through staging), mixed in one batch with a quantized
// block that must be expanded on the CPU first, every byte exact.
void expect_direct_copies_bit_exact(const KvLayout& l) {
  Fixture f(12, testing::share_layout(l));
  ASSERT_GE(f.layout->dense_block_bytes(), kLargeBufferThreshold);
  std::vector<BlockRef> blocks;
  for (uint64_t s = 1; s <= 6; ++s) blocks.push_back(f.block(s, testing::Values::kRandom));
  ASSERT_NE(large_buffer_chunk(blocks[0]->data().data()).base, nullptr);
  auto q = f.block(7, testing::Values::kRandom)->quantized(Quantization{8, 64});
  ASSERT_TRUE(q.ok());
  blocks.push_back(std::make_shared<const Block>(std::move(q).value()));
  for (auto& o : f.tier->insert_many(blocks)) ASSERT_TRUE(o.ok() && *o == InsertOutcome::kInserted);
  EXPECT_EQ(f.tier->metrics().direct_up.value(), 6u) << "the quantized block is expanded and staged";
  EXPECT_GT(f.tier->metrics().uploads.value(), 0u);

  std::vector<BlockRequest> reqs;
  for (auto& b : blocks) reqs.push_back(request_for(b));
  auto got = f.tier->read_many(reqs);
  EXPECT_EQ(f.tier->metrics().direct_down.value(), 7u);
  for (size_t i = 0; i < blocks.size(); ++i) {
    ASSERT_TRUE(got[i].ok()) << got[i].status().to_string();
    const Block want = i == 6 ? blocks[i]->dequantized() : blocks[i]->clone();
    ASSERT_TRUE(testing::same_bytes(**got[i], want)) << "block " << i;
  }
  // Evictions leave through the same direct path: the exact bytes handed down.
  std::vector<BlockRef> more;
  for (uint64_t s = 10; s <= 19; ++s) more.push_back(f.block(s, testing::Values::kRandom));
  for (auto& o : f.tier->insert_many(more)) ASSERT_TRUE(o.ok());
  ASSERT_FALSE(f.evicted.empty());
  for (const BlockRef& e : f.evicted) {
    auto it = std::find_if(blocks.begin(), blocks.end(), [&](const BlockRef& b) { return b->hash() == e->hash(); });
    ASSERT_NE(it, blocks.end());
    const Block want = it == blocks.end() - 1 ? (*it)->dequantized() : (*it)->clone();
    EXPECT_TRUE(testing::same_bytes(*e, want));
  }
  EXPECT_EQ(f.tier->metrics().direct_down.value(), 7u + f.evicted.size());
  EXPECT_EQ(f.tier->metrics().import_failures.value(), 0u);
}

TEST(GpuTierTest, LargeHostBlocksCrossByDirectCopiesBitExact) {
  if (gpu().info().host_import_alignment == 0) GTEST_SKIP() << "the device cannot import host memory";
  KvLayout l = KvLayout::uniform("gpu-tier-direct", 3, 8, 128, 16, DType::kF32);  // 576 KiB
  l.layers[1].dtype = DType::kF16;
  l.layers[2].dtype = DType::kBF16;
  expect_direct_copies_bit_exact(l);
}

// A small model's blocks (16 KiB here, as the `tiny` preset's) take the same direct path.
TEST(GpuTierTest, SmallHostBlocksCrossByDirectCopiesBitExact) {
  if (gpu().info().host_import_alignment == 0) GTEST_SKIP() << "the device cannot import host memory";
  const KvLayout l = KvLayout::uniform("gpu-tier-direct-small", 2, 2, 64, 16, DType::kBF16);
  ASSERT_EQ(l.dense_block_bytes(), 16u << 10);
  expect_direct_copies_bit_exact(l);
}

}  // namespace
}  // namespace kvtier
