#include "base/memory/large_buffer_cache.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <unordered_map>
#include <vector>

namespace kvtier {

namespace {

// Size classes: 4 KiB steps under 256 KiB (a small model's 16 KiB block takes a 16 KiB slot, not
// a 64 KiB one), 64 KiB steps above.
constexpr size_t kSmallClass = 4 << 10;
constexpr size_t kClass = 64 << 10;
constexpr size_t kSmallClassesBelow = 256 << 10;

size_t size_class(size_t bytes) {
  const size_t step = bytes < kSmallClassesBelow ? kSmallClass : kClass;
  return (bytes + step - 1) / step * step;
}

// Freed buffers by size, kept up to a byte limit.
struct Cache {
  std::mutex mu;  // guards everything below
  std::unordered_map<size_t, std::vector<void*>> free_by_size;
  size_t cached = 0;
  size_t limit = 512u << 20;

  // A kept buffer of exactly `size` bytes, or nullptr.
  void* take(size_t size) {
    std::lock_guard lock(mu);
    auto it = free_by_size.find(size);
    if (it == free_by_size.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();
    it->second.pop_back();
    cached -= size;
    return p;
  }
  // True when `p` is kept; false when it would pass the limit (the caller frees it).
  bool keep(void* p, size_t size) {
    std::lock_guard lock(mu);
    if (cached + size > limit) return false;
    free_by_size[size].push_back(p);
    cached += size;
    return true;
  }
};

// Large buffers: slots of mmapped chunks, one size class per chunk.
constexpr size_t kChunkTarget = 64u << 20;

struct Chunk {
  uint8_t* base = nullptr;
  size_t bytes = 0;
  size_t slot = 0;  // bytes per slot (the size class)
  uint32_t slots = 0;
  uint32_t used = 0;
  int holds = 0;
  uint32_t cached_slots = 0;     // free slots whose pages are kept
  std::vector<uint32_t> free;    // handed back, most recent last (reused first: still cached)
  std::vector<bool> zero;        // slot is known zero (never handed out, or its pages dropped)
  // free[0, zero_prefix) are known zero: trimming starts after them, so a chunk of thousands of
  // small slots is not rescanned on every release once the cache is at its limit.
  size_t zero_prefix = 0;
  uint64_t touched = 0;  // the arena's tick when a slot was last taken or handed back
  bool has_room() const { return !free.empty(); }
};

struct Arena {
  std::mutex mu;  // guards everything below
  std::map<uintptr_t, std::unique_ptr<Chunk>> chunks;          // by base address
  std::unordered_map<size_t, std::set<Chunk*>> with_room;      // by slot size
  std::unordered_map<size_t, Chunk*> last_freed;               // by slot size: reuse warm slots
  // Bytes of free slots whose pages are kept, in chunks nobody holds (a held chunk's pages stay
  // whatever the limit, so they are not counted against it).
  size_t cached = 0;
  size_t limit = 512u << 20;
  uint64_t tick = 0;  // counts acquires and releases: a chunk's `touched` is one of these

  Chunk* find(const void* p) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    auto it = chunks.upper_bound(a);
    if (it == chunks.begin()) return nullptr;
    --it;
    Chunk* c = it->second.get();
    return a < it->first + c->bytes ? c : nullptr;
  }

  Chunk* new_chunk(size_t slot) {
    const uint32_t slots = static_cast<uint32_t>(std::max<size_t>(1, kChunkTarget / slot));
    const size_t bytes = slots * slot;
    // Aligned to 2 MiB and backed by huge pages where the kernel allows: fewer page faults, and
    // fewer translations for a device that copies from the chunk.
    constexpr size_t kHuge = 2u << 20;
    void* m = ::mmap(nullptr, bytes + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return nullptr;
    const auto raw_at = reinterpret_cast<uintptr_t>(m);
    const uintptr_t at = (raw_at + kHuge - 1) / kHuge * kHuge;
    if (at > raw_at) ::munmap(m, at - raw_at);
    if (const size_t tail = raw_at + bytes + kHuge - (at + bytes); tail > 0) ::munmap(reinterpret_cast<void*>(at + bytes), tail);
    void* p = reinterpret_cast<void*>(at);
    ::madvise(p, bytes, MADV_HUGEPAGE);
    auto c = std::make_unique<Chunk>();
    c->base = static_cast<uint8_t*>(p);
    c->bytes = bytes;
    c->slot = slot;
    c->slots = slots;
    c->zero.assign(slots, true);
    c->free.reserve(slots);
    for (uint32_t i = slots; i-- > 0;) c->free.push_back(i);  // slot 0 first
    c->zero_prefix = slots;
    Chunk* raw = c.get();
    chunks.emplace(reinterpret_cast<uintptr_t>(p), std::move(c));
    with_room[slot].insert(raw);
    return raw;
  }

  // Drops the pages of free slots (or whole chunks) that nobody holds, the chunks touched longest
  // ago first, until `cached` is 1/8 below the limit. Coldest first: trimming the chunk a release
  // just went into (as this did) kept a restore's own size class churning — each slot it took
  // back was zeroed and faulted in again, and each drop cost a TLB shootdown — while size classes
  // nobody used any more (a finished spill's frames) kept their pages. The margin batches the
  // work: a release just over the limit does not sort the chunks again.
  void trim() {
    const size_t target = limit - limit / 8;
    auto trim_chunk = [&](Chunk* c) {
      if (c->used == 0) {
        cached -= c->cached_slots * c->slot;
        with_room[c->slot].erase(c);
        // find, not []: [] would leave a null entry for a size with none, and the next acquire of
        // that size dereferenced it (a crash seen once blocks of two sizes shared the process).
        if (auto it = last_freed.find(c->slot); it != last_freed.end() && it->second == c) last_freed.erase(it);
        ::munmap(c->base, c->bytes);
        chunks.erase(reinterpret_cast<uintptr_t>(c->base));
        return;
      }
      for (size_t k = c->zero_prefix; k < c->free.size() && cached > target; ++k) {
        const uint32_t s = c->free[k];
        if (!c->zero[s]) {
          ::madvise(c->base + s * c->slot, c->slot, MADV_DONTNEED);  // reads back as zero
          c->zero[s] = true;
          --c->cached_slots;
          cached -= c->slot;
        }
        if (k == c->zero_prefix) ++c->zero_prefix;
      }
    };
    std::vector<Chunk*> order;
    for (const auto& [base, c] : chunks) {
      if (c->holds == 0 && (c->used == 0 || c->cached_slots > 0)) order.push_back(c.get());
    }
    std::sort(order.begin(), order.end(), [](const Chunk* x, const Chunk* y) { return x->touched < y->touched; });
    for (Chunk* c : order) {
      if (cached <= target) break;
      trim_chunk(c);  // may unmap and erase c, which `order` does not visit again
    }
  }
};

Arena& arena() {
  static Arena* a = new Arena();  // never destroyed: buffers may be released during exit
  return *a;
}

std::atomic<LargeBufferChunkListener> g_chunk_listener{nullptr};

}  // namespace

void set_large_buffer_chunk_listener(LargeBufferChunkListener listener) {
  g_chunk_listener.store(listener);
}

std::vector<LargeBufferChunk> large_buffer_chunks() {
  std::lock_guard lock(arena().mu);
  std::vector<LargeBufferChunk> out;
  out.reserve(arena().chunks.size());
  for (const auto& [base, c] : arena().chunks) out.push_back({c->base, c->bytes});
  return out;
}

std::optional<std::vector<LargeBufferChunk>> large_buffer_reserve(size_t bytes, size_t count) {
  const size_t size = size_class(bytes);
  Arena& a = arena();
  std::vector<LargeBufferChunk> held;
  std::vector<LargeBufferChunk> created;
  bool mapped_all = true;
  {
    std::lock_guard lock(a.mu);
    size_t room = 0;
    for (const Chunk* c : a.with_room[size]) room += c->free.size();
    while (room < count) {
      Chunk* c = a.new_chunk(size);
      if (c == nullptr) {
        mapped_all = false;
        break;
      }
      room += c->free.size();
      created.push_back({c->base, c->bytes});
    }
    if (mapped_all) {
      for (Chunk* c : a.with_room[size]) {
        if (c->holds++ == 0) a.cached -= c->cached_slots * c->slot;
        held.push_back({c->base, c->bytes});
      }
    }
  }
  if (LargeBufferChunkListener listener = g_chunk_listener.load()) {
    for (const LargeBufferChunk& c : created) listener(c);
  }
  if (!mapped_all) return std::nullopt;  // the new chunks are free slots: trimmed like any others
  return held;
}

void* large_buffer_acquire(size_t bytes, bool* fresh) {
  const size_t size = size_class(bytes);
  Arena& a = arena();
  uint8_t* p = nullptr;
  LargeBufferChunk created;
  {
    std::lock_guard lock(a.mu);
    Chunk* c = nullptr;
    if (auto it = a.last_freed.find(size); it != a.last_freed.end() && it->second->has_room()) {
      c = it->second;
    } else if (auto& room = a.with_room[size]; !room.empty()) {
      c = *room.begin();
    } else {
      c = a.new_chunk(size);
      if (c == nullptr) return nullptr;
      created = {c->base, c->bytes};
    }
    const uint32_t s = c->free.back();
    c->free.pop_back();
    c->zero_prefix = std::min(c->zero_prefix, c->free.size());
    if (!c->has_room()) a.with_room[size].erase(c);
    ++c->used;
    *fresh = c->zero[s];
    if (!c->zero[s]) {
      --c->cached_slots;
      if (c->holds == 0) a.cached -= size;
    }
    c->zero[s] = false;
    c->touched = ++a.tick;
    p = c->base + s * size;
  }
#ifdef MADV_POPULATE_WRITE
  // Fault the pages in now, in one call, rather than one fault per page in the first copy.
  if (*fresh) ::madvise(p, size, MADV_POPULATE_WRITE);
#endif
  if (created.base != nullptr) {
    if (LargeBufferChunkListener listener = g_chunk_listener.load()) listener(created);
  }
  return p;
}

void large_buffer_release(void* p, size_t bytes) {
  const size_t size = size_class(bytes);
  Arena& a = arena();
  std::lock_guard lock(a.mu);
  Chunk* c = a.find(p);
  if (c == nullptr || c->slot != size) std::abort();  // not ours: a heap corruption
  const auto s = static_cast<uint32_t>((static_cast<uint8_t*>(p) - c->base) / size);
  if (!c->has_room()) a.with_room[size].insert(c);
  c->free.push_back(s);
  --c->used;
  ++c->cached_slots;
  if (c->holds == 0) a.cached += size;
  a.last_freed[size] = c;
  c->touched = ++a.tick;
  if (a.cached > a.limit) a.trim();
}

void set_large_buffer_cache_limit(size_t bytes) {
  Arena& a = arena();
  std::lock_guard lock(a.mu);
  a.limit = bytes;
  if (a.cached > a.limit) a.trim();
}

size_t large_buffer_cached_bytes() {
  std::lock_guard lock(arena().mu);
  return arena().cached;
}

LargeBufferChunk large_buffer_chunk(const void* p) {
  std::lock_guard lock(arena().mu);
  const Chunk* c = arena().find(p);
  return c ? LargeBufferChunk{c->base, c->bytes} : LargeBufferChunk{};
}

void large_buffer_hold_chunk(const void* base) {
  std::lock_guard lock(arena().mu);
  Arena& a = arena();
  Chunk* c = a.find(base);
  if (c != nullptr && c->holds++ == 0) a.cached -= c->cached_slots * c->slot;
}

void large_buffer_unhold_chunk(const void* base) {
  Arena& a = arena();
  std::lock_guard lock(a.mu);
  Chunk* c = a.find(base);
  if (c == nullptr || c->holds == 0) return;
  if (--c->holds > 0) return;
  a.cached += c->cached_slots * c->slot;
  if (a.cached > a.limit) a.trim();
}

namespace {
constexpr size_t kPage = 4096;
Cache& small_cache() {
  static Cache* c = [] {
    auto* n = new Cache();  // never destroyed, as above
    n->limit = 64u << 20;
    return n;
  }();
  return *c;
}
}  // namespace

void* small_page_buffer_acquire(size_t bytes) {
  const size_t size = (bytes + kPage - 1) / kPage * kPage;
  if (void* p = small_cache().take(size)) return p;
  return std::aligned_alloc(kPage, size);
}

void small_page_buffer_release(void* p, size_t bytes) {
  const size_t size = (bytes + kPage - 1) / kPage * kPage;
  if (!small_cache().keep(p, size)) std::free(p);
}

}  // namespace kvtier
