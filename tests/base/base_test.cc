#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <spdlog/sinks/ringbuffer_sink.h>

#include "base/byte_size.h"
#include "base/log.h"
#include "base/memory/aligned_buffer.h"
#include "base/memory/large_buffer_cache.h"
#include "base/metrics/metrics.h"
#include "base/status.h"

namespace kvtier {
namespace {

TEST(ByteSizeTest, ParsesWhatPeopleWrite) {
  EXPECT_EQ(*parse_byte_size("4096"), 4096u);
  EXPECT_EQ(*parse_byte_size("512M"), 512ull << 20);
  EXPECT_EQ(*parse_byte_size("8G"), 8ull << 30);
  EXPECT_EQ(*parse_byte_size("8GiB"), 8ull << 30);
  EXPECT_EQ(*parse_byte_size("1.5k"), 1536u);
  EXPECT_EQ(*parse_byte_size("2T"), 2ull << 40);
  for (const char* bad : {"", "G", "12X", "-5", "1.2.3M", "99999999999T"}) {
    auto r = parse_byte_size(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    }
  }
}

TEST(StatusTest, ErrnoNoSpaceMapsToNoSpaceAndKeepsContext) {
  Status s = errno_status("write segment 3", ENOSPC).with_context("spill");
  EXPECT_EQ(s.code(), StatusCode::kNoSpace);
  EXPECT_EQ(s.message().rfind("spill: write segment 3: ", 0), 0u) << s.message();
  EXPECT_NE(s.message().find("errno 28"), std::string::npos);
  EXPECT_EQ(errno_status("read", EIO).code(), StatusCode::kIoError);
}

TEST(StatusTest, ResultCarriesValueOrError) {
  Result<int> good = 5;
  Result<int> bad = not_found("nope");
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(*good, 5);
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kNotFound);
}

TEST(LogThrottleTest, AdmitsFirstThenFoldsRepeatsWithinTheInterval) {
  LogThrottle t(std::chrono::hours(1));
  auto first = t.admit();
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(*first, 0u);
  for (int i = 0; i < 10; ++i) EXPECT_FALSE(t.admit().has_value());
  LogThrottle fast(std::chrono::milliseconds(0));
  ASSERT_TRUE(fast.admit().has_value());
  ASSERT_TRUE(fast.admit().has_value());
}

TEST(LogThrottleTest, LogsAnAdmittedLineWithHowManyWereFoldedIntoIt) {
  auto sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(8);
  sink->set_pattern("%l %v");
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("throttle-test", sink));
  LogThrottle t(std::chrono::milliseconds(200));
  t.warn("block {} dropped: {}", 7, "no room");
  for (int i = 0; i < 3; ++i) t.warn("block {} dropped: {}", 8 + i, "no room");  // folded
  std::this_thread::sleep_for(std::chrono::milliseconds(250));  // the interval itself is the subject
  t.error("block {} dropped: {}", 11, "I/O error");
  spdlog::set_default_logger(previous);
  EXPECT_EQ(sink->last_formatted(), (std::vector<std::string>{
                                        "warning block 7 dropped: no room (0 similar suppressed)\n",
                                        "error block 11 dropped: I/O error (3 similar suppressed)\n"}));
}

TEST(HistogramTest, QuantilesFallInTheRightBucket) {
  Histogram h;
  for (int i = 0; i < 99; ++i) h.observe(0.001);
  h.observe(1.0);
  auto s = h.snapshot();
  EXPECT_EQ(s.count, 100u);
  EXPECT_LE(s.quantile(0.5), 0.0016);
  EXPECT_GE(s.quantile(0.5), 0.0008);
  EXPECT_GE(s.quantile(1.0), 0.8);
  EXPECT_NEAR(s.sum, 99 * 0.001 + 1.0, 1e-6);
}

}  // namespace
}  // namespace kvtier

namespace kvtier {
namespace {

// Page-aligned buffers come back for reuse by size class: small (an O_DIRECT record of a 16 KiB
// block) and large (2 MiB) alike, aligned, and the contents asked to be zero are zero.
TEST(AlignedBufferReuseTest, FreedBuffersAreReusedBySizeClassAndStayAligned) {
  for (const size_t size : {size_t{20} << 10, size_t{2} << 20}) {
    void* first = nullptr;
    {
      AlignedBuffer a(size, 4096, /*zeroed=*/false);
      ASSERT_EQ(reinterpret_cast<uintptr_t>(a.data()) % 4096, 0u);
      std::memset(a.data(), 0xab, size);
      first = a.data();
    }
    AlignedBuffer again(size - 100, 4096, /*zeroed=*/true);  // the same 4 KiB class
    EXPECT_EQ(again.data(), first) << size << " bytes: the freed buffer is handed out again";
    for (size_t i = 0; i < again.size(); i += 997) ASSERT_EQ(again.data()[i], 0) << "at " << i;
  }
  AlignedBuffer other(16 << 10, 64, /*zeroed=*/false);  // not page-aligned: the heap's as before
  EXPECT_EQ(reinterpret_cast<uintptr_t>(other.data()) % 64, 0u);
}

// Large buffers are slots of chunks: a buffer lies inside the chunk named for it; beyond the cache
// limit a freed slot's pages are dropped (it comes back known zero), and a chunk with no buffer
// left is unmapped — unless it is held (imported by a device), which keeps it and its bytes. The
// same for the 4 KiB classes under 256 KiB (a small model's blocks) as for the 64 KiB ones above.
TEST(LargeBufferChunksTest, BuffersLieInChunksAndHeldChunksOutliveTheLimit) {
  // Size classes no other test uses, and the slot each rounds up to.
  const std::pair<size_t, size_t> cases[] = {{(3u << 20) + (192u << 10), (3u << 20) + (192u << 10)},
                                             {(44u << 10) + 100, 48u << 10}};
  for (const auto& [size, slot] : cases) {
    SCOPED_TRACE("size " + std::to_string(size));
    ASSERT_GE(size, kLargeBufferThreshold);
    bool fresh = false;
    auto* a = static_cast<uint8_t*>(large_buffer_acquire(size, &fresh));
    auto* b = static_cast<uint8_t*>(large_buffer_acquire(size, &fresh));
    ASSERT_NE(a, nullptr);
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(static_cast<size_t>(b - a), slot) << "slots of one class lie side by side";
    const LargeBufferChunk chunk = large_buffer_chunk(a);
    ASSERT_NE(chunk.base, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(chunk.base) % 4096, 0u);
    EXPECT_LE(chunk.base, a);
    EXPECT_LE(a + size, chunk.base + chunk.bytes);
    EXPECT_EQ(large_buffer_chunk(b).base, chunk.base) << "one chunk per size class until it is full";
    int on_stack = 0;
    EXPECT_EQ(large_buffer_chunk(&on_stack).base, nullptr);

    std::memset(a, 0x5a, size);
    std::memset(b, 0x5b, size);
    large_buffer_release(a, size);
    set_large_buffer_cache_limit(0);  // a's pages go back; b keeps the chunk
    auto* again = static_cast<uint8_t*>(large_buffer_acquire(size, &fresh));
    EXPECT_EQ(again, a);
    EXPECT_TRUE(fresh) << "a dropped slot reads back as zero";
    EXPECT_EQ(again[size / 2], 0);
    large_buffer_release(again, size);

    large_buffer_hold_chunk(chunk.base);
    large_buffer_release(b, size);  // no buffer left in the chunk, over the limit: but held
    EXPECT_EQ(large_buffer_chunk(b).base, chunk.base);
    EXPECT_EQ(b[size - 1], 0x5b) << "a held chunk keeps its pages";
    large_buffer_unhold_chunk(chunk.base);
    EXPECT_EQ(large_buffer_chunk(b).base, nullptr) << "unheld and empty: unmapped";
    set_large_buffer_cache_limit(512u << 20);
  }
}

}  // namespace
// Trimming empty chunks of a size class, in whatever order they lie, leaves the class usable: the
// trim once left a null "last freed" entry for a class and the next acquire of it crashed (seen on
// the H100 host when a 32 KiB-block cache was trimmed before a 256 KiB-block one filled).
// A CUDA door page-locks chunks as they are mapped (inprocess/cuda/cuda_host_pinning.h): the
// listener hears of each new chunk once, after the fact, and the list of chunks names it.
std::vector<LargeBufferChunk> g_heard;
void hear_chunk(LargeBufferChunk c) { g_heard.push_back(c); }

TEST(LargeBufferChunksTest, AListenerHearsOfEachNewChunkOnce) {
  const size_t size = (5u << 20) + (64u << 10);  // a class no other test uses: 12 slots a chunk
  g_heard.clear();
  set_large_buffer_chunk_listener(&hear_chunk);
  bool fresh = false;
  void* a = large_buffer_acquire(size, &fresh);
  void* b = large_buffer_acquire(size, &fresh);  // the same chunk: not heard again
  set_large_buffer_chunk_listener(nullptr);
  void* c = large_buffer_acquire(64u << 20, &fresh);  // a new chunk, with no listener: not heard
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_NE(c, nullptr);
  const LargeBufferChunk chunk = large_buffer_chunk(a);
  ASSERT_EQ(g_heard.size(), 1u);
  EXPECT_EQ(g_heard[0].base, chunk.base);
  EXPECT_EQ(g_heard[0].bytes, chunk.bytes);
  const std::vector<LargeBufferChunk> all = large_buffer_chunks();
  EXPECT_TRUE(std::any_of(all.begin(), all.end(), [&](const LargeBufferChunk& x) {
    return x.base == chunk.base && x.bytes == chunk.bytes;
  }));
  large_buffer_release(a, size);
  large_buffer_release(b, size);
  large_buffer_release(c, 64u << 20);
}

TEST(LargeBufferChunksTest, ASizeClassWhoseChunksWereAllTrimmedIsAcquiredAgain) {
  const size_t size = 40u << 20;  // one slot per chunk: three buffers, three chunks
  bool fresh = false;
  void* bufs[3];
  for (void*& b : bufs) {
    b = large_buffer_acquire(size, &fresh);
    ASSERT_NE(b, nullptr);
  }
  for (void* b : bufs) large_buffer_release(b, size);  // kept: within the limit
  set_large_buffer_cache_limit(0);                    // every chunk empty and unheld: all unmapped
  for (void* b : bufs) EXPECT_EQ(large_buffer_chunk(b).base, nullptr);
  void* again = large_buffer_acquire(size, &fresh);
  ASSERT_NE(again, nullptr);
  EXPECT_TRUE(fresh);
  large_buffer_release(again, size);
  set_large_buffer_cache_limit(512u << 20);
}

// Over the limit, the cache drops the pages of the size classes touched longest ago, not those of
// the class a release just went into: a restore's blocks otherwise came back zeroed and faulted
// in on every reuse while a finished spill's frames kept their pages.
TEST(LargeBufferChunksTest, TheColdestSizeClassIsTrimmedFirst) {
  const size_t cold = (1u << 20) + (320u << 10), hot = (1u << 20) + (448u << 10);  // classes no other test uses
  set_large_buffer_cache_limit(8u << 20);
  bool fresh = false;
  std::vector<void*> bufs;
  for (int i = 0; i < 5; ++i) bufs.push_back(large_buffer_acquire(cold, &fresh));
  for (void* b : bufs) large_buffer_release(b, cold);  // 6.6 MiB kept: within the limit
  void* cold_at = bufs.front();
  ASSERT_NE(large_buffer_chunk(cold_at).base, nullptr);

  auto* h1 = static_cast<uint8_t*>(large_buffer_acquire(hot, &fresh));
  auto* h2 = static_cast<uint8_t*>(large_buffer_acquire(hot, &fresh));
  std::memset(h1, 0x11, hot);
  std::memset(h2, 0x22, hot);
  large_buffer_release(h1, hot);
  large_buffer_release(h2, hot);  // 9.5 MiB kept: over the limit
  EXPECT_EQ(large_buffer_chunk(cold_at).base, nullptr) << "the cold class's empty chunk went first";
  auto* again = static_cast<uint8_t*>(large_buffer_acquire(hot, &fresh));
  EXPECT_EQ(again, h2);
  EXPECT_FALSE(fresh) << "the hot class kept its pages";
  EXPECT_EQ(again[hot / 2], 0x22);
  large_buffer_release(again, hot);
  set_large_buffer_cache_limit(512u << 20);
}

// A cache that page-locks its RAM budget for a CUDA engine at open reserves it first: afterwards
// that many buffers of the class come without mapping a chunk (none is registered beside the
// engine's work), the listener heard of every chunk the reservation mapped, and the reserved
// chunks stay mapped, pages and all, until they are let go.
TEST(LargeBufferChunksTest, AReservationMapsEnoughChunksAndHoldsThem) {
  const size_t size = (6u << 20) + (128u << 10);  // a class no other test uses: 10 slots a chunk
  const size_t count = 25;                        // three chunks
  g_heard.clear();
  set_large_buffer_chunk_listener(&hear_chunk);
  const auto held = large_buffer_reserve(size, count);
  set_large_buffer_chunk_listener(nullptr);
  ASSERT_TRUE(held.has_value());
  ASSERT_EQ(held->size(), 3u);
  EXPECT_EQ(g_heard.size(), 3u) << "each chunk the reservation mapped is heard of, once";
  const size_t mapped = large_buffer_chunks().size();
  std::vector<void*> bufs;
  bool fresh = false;
  for (size_t i = 0; i < count; ++i) {
    bufs.push_back(large_buffer_acquire(size, &fresh));
    ASSERT_NE(bufs.back(), nullptr);
    const bool in_reserved = std::any_of(
        held->begin(), held->end(),
        [&](const LargeBufferChunk& c) { return c.base == large_buffer_chunk(bufs.back()).base; });
    EXPECT_TRUE(in_reserved) << "buffer " << i << " lies outside the reservation";
  }
  EXPECT_EQ(large_buffer_chunks().size(), mapped) << "no chunk mapped after the reservation";
  std::memset(bufs[0], 0x6c, size);
  for (void* b : bufs) large_buffer_release(b, size);
  set_large_buffer_cache_limit(0);
  for (const LargeBufferChunk& c : *held)
    EXPECT_EQ(large_buffer_chunk(c.base).base, c.base) << "held";
  EXPECT_EQ(static_cast<uint8_t*>(bufs[0])[size - 1], 0x6c) << "a held chunk keeps its pages";
  EXPECT_FALSE(large_buffer_reserve(size_t{1} << 46, 1 << 20).has_value())
      << "64 TiB per buffer cannot be mapped: nullopt, and nothing held";
  for (const LargeBufferChunk& c : *held) large_buffer_unhold_chunk(c.base);
  for (const LargeBufferChunk& c : *held)
    EXPECT_EQ(large_buffer_chunk(c.base).base, nullptr) << "let go";
  set_large_buffer_cache_limit(512u << 20);
}

}  // namespace kvtier
