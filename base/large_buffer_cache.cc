#include "base/large_buffer_cache.h"

#include <sys/mman.h>

#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace kvtier {

namespace {

constexpr size_t kClass = 64 << 10;

size_t size_class(size_t bytes) { return (bytes + kClass - 1) / kClass * kClass; }

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

Cache& cache() {
  static Cache* c = new Cache();  // never destroyed: buffers may be released during exit
  return *c;
}

}  // namespace

void* large_buffer_acquire(size_t bytes, bool* fresh) {
  const size_t size = size_class(bytes);
  if (void* p = cache().take(size)) {
    *fresh = false;
    return p;
  }
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
                   -1, 0);
  *fresh = true;
  return p == MAP_FAILED ? nullptr : p;
}

void large_buffer_release(void* p, size_t bytes) {
  const size_t size = size_class(bytes);
  if (!cache().keep(p, size)) ::munmap(p, size);
}

void set_large_buffer_cache_limit(size_t bytes) {
  Cache& c = cache();
  std::vector<std::pair<void*, size_t>> drop;
  {
    std::lock_guard lock(c.mu);
    c.limit = bytes;
    for (auto& [size, list] : c.free_by_size) {
      while (c.cached > c.limit && !list.empty()) {
        drop.emplace_back(list.back(), size);
        list.pop_back();
        c.cached -= size;
      }
    }
  }
  for (auto [p, size] : drop) ::munmap(p, size);
}

size_t large_buffer_cached_bytes() {
  std::lock_guard lock(cache().mu);
  return cache().cached;
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
