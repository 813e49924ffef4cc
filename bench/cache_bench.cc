// cache_bench: the cost of the cache's bookkeeping.
//  1. Block hashes per second, SHA-256 and xxh3-128, 16-token blocks.
//  2. Lookup latency for a 128k-token prompt that is fully cached (8192 blocks), median and p99,
//     from tokens (hashing included) and from precomputed keys.
//  3. Insert and fetch throughput of Llama-3-8B blocks (2 MiB, bf16) in the RAM tier, in GB/s of
//     block data, against memcpy of the same bytes in the same run.
//  4. A GPU hit's bookkeeping (a prefix the GPU tier holds, a small 4-layer bf16 layout): hash,
//     keys from the memo, lookup, pin and release, and the lookup that pins in the same pass,
//     with the CPU's caches warm and cold, against floors measured in the same run: SHA-256 of
//     the same bytes in one call, and a hash-map find per block. On the default Vulkan device
//     (lavapipe here).
//  5. A prompt only the SSD tier holds, looked up as CachedGenerator does, warm and cold, beside
//     the SSD tier's own answer for the same blocks: what a plan that then computes everything
//     pays first.
#include <openssl/evp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>
#include <random>
#include <unordered_map>
#include <unordered_set>

#include "base/byte_size.h"
#include "base/memory/memory_policy.h"
#include "bench/harness/bench_report.h"
#include "cache/cache_stack.h"
#include "cache/prefix_key_memo.h"
#include "cache/tiered_cache.h"
#include "tests/support/temp_dir.h"
#include "tests/support/test_blocks.h"
#include "tiers/ram_tier.h"

using namespace kvtier;
using namespace kvtier::bench;

namespace {

std::vector<uint32_t> random_tokens(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint32_t> t(n);
  for (auto& x : t) x = rng() % 128256;
  return t;
}

double ms_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// Streams 256 MiB through the CPU's caches, as a server's other work does between two requests:
// the restore's tables are then where a request finds them. (On the H200 host a GPU hit's lookup
// and pin took 3-4x what this table's warm rows said, between runs of the real forward.)
void evict_cpu_caches() {
  static std::vector<uint64_t> junk(32u << 20);
  uint64_t sum = 0;
  for (size_t i = 0; i < junk.size(); i += 8) {
    junk[i] += i;
    sum += junk[i];
  }
  asm volatile("" ::"r"(sum) : "memory");
}

// The small 4-layer bf16 layout of the bookkeeping tables, and a stack opened with `o` (its layout
// and Vulkan device filled in) holding nothing yet, with a random prompt's SHA-256 keys.
std::shared_ptr<const KvLayout> bookkeeping_layout() {
  static const auto layout =
      testing::share(KvLayout::uniform("tiny-bf16", 4, 4, 64, 16, DType::kBF16));
  return layout;
}
struct PromptOnStack {
  PromptOnStack(std::unique_ptr<CacheStack> s, PrefixHasher h, std::vector<uint32_t> t)
      : stack(std::move(s)),
        hasher(std::move(h)),
        memo(hasher),
        tokens(std::move(t)),
        keys(hasher.keys(tokens, {})) {}
  PromptOnStack(const PromptOnStack&) = delete;  // memo refers to hasher
  std::unique_ptr<CacheStack> stack;
  PrefixHasher hasher;
  PrefixKeyMemo memo;
  std::vector<uint32_t> tokens;
  std::vector<BlockKey> keys;
};
std::unique_ptr<PromptOnStack> open_with_prompt(VulkanContext& ctx, CacheStackOptions o, size_t n,
                                                uint32_t seed) {
  o.layout = bookkeeping_layout();
  o.vulkan = &ctx;
  auto stack = CacheStack::open(o);
  if (!stack.ok()) {
    std::printf("cache_bench: %s\n", stack.status().to_string().c_str());
    return nullptr;
  }
  PrefixHasher h(HashAlgorithm::kSha256, Namespace{"bench", o.layout->fingerprint(), ""}, 16);
  return std::make_unique<PromptOnStack>(std::move(*stack), std::move(h), random_tokens(n, seed));
}

// 4. What a hit on blocks already on the GPU costs the host before its forward starts, as
// CachedGenerator does it: the prompt's keys (hashed, and from the key memo as a repeated prompt
// finds them), the prefix looked up, pinned where it lies, released after the forward.
void bench_gpu_hit_bookkeeping() {
  auto ctx = VulkanContext::create();
  if (!ctx.ok()) {
    std::printf("cache_bench: no Vulkan device (%s): GPU hit bookkeeping skipped\n", ctx.status().to_string().c_str());
    return;
  }
  Report r("cache_bench: a GPU hit's bookkeeping (prefix on the GPU tier, SHA-256 keys), medians",
           {"prompt tokens", "CPU caches", "hash ms", "SHA-256 of the bytes ms",
            "keys from the memo ms", "lookup ms", "pin ms", "hash-map finds ms", "release ms",
            "memo + lookup + pin ms", "lookup pinning the GPU's ms", "memo + lookup pinning ms"});
  r.set_meta("machine", machine_description());
  r.set_meta("vulkan", (*ctx)->info().name);
  for (const size_t n : {2048, 8192, 32768}) {
    const uint32_t blocks = static_cast<uint32_t>(n / 16);
    CacheStackOptions o;
    o.gpu_pool.num_blocks = blocks + 16;
    o.ram.capacity_bytes = 64ull << 20;
    const auto p = open_with_prompt(**ctx, o, n, 7);
    if (!p) return;
    auto& [stack, h, memo, tokens, keys] = *p;
    auto ids = stack->gpu()->allocate(blocks);
    if (!ids.ok()) std::abort();
    for (uint32_t i = 0; i < blocks; ++i) {
      if (stack->gpu()->publish((*ids)[i], h.identity(keys, i, {})))
        std::abort();  // a duplicate key: none here
    }
    stack->gpu()->release(*ids);
    std::unordered_map<BlockHash, int32_t> map;
    for (uint32_t i = 0; i < blocks; ++i) map.emplace(keys[i].hash, static_cast<int32_t>(i));
    EVP_MD* sha = EVP_MD_fetch(nullptr, "SHA256", nullptr);
    memo.keys(tokens, {});  // remembered, as the request before a repeated prompt leaves it
    for (const bool cold : {false, true}) {
      std::vector<double> hash, sha_bytes, from_memo, lookup, pin, finds, release, total, one_pass,
          one_pass_total;
      for (int rep = 0; rep < 31; ++rep) {
        using Clock = std::chrono::steady_clock;
        const auto t0 = Clock::now();
        const auto hashed = h.keys(tokens, {});
        const auto t1 = Clock::now();
        asm volatile("" ::"r"(hashed.data()) : "memory");
        if (cold) evict_cpu_caches();
        const auto t2 = Clock::now();
        const auto k = memo.keys(tokens, {});
        const auto t3 = Clock::now();
        const LookupResult found = stack->cache().lookup(k);
        const auto t4 = Clock::now();
        PinnedBlocks pinned = stack->cache().fetch(k, found);
        const auto t5 = Clock::now();
        if (found.blocks.size() != blocks || pinned.size() != blocks) std::abort();
        pinned.release();
        const auto t6 = Clock::now();
        if (cold) evict_cpu_caches();
        uint8_t digest[32];
        unsigned int len = 0;
        const auto t7 = Clock::now();
        EVP_Digest(tokens.data(), tokens.size() * 4, digest, &len, sha, nullptr);
        const auto t8 = Clock::now();
        if (cold) evict_cpu_caches();
        const auto t9 = Clock::now();
        int64_t sum = 0;
        for (const BlockKey& key : k) sum += map.find(key.hash)->second;
        const auto t10 = Clock::now();
        if (sum < 0) std::abort();
        // As CachedGenerator does it: the GPU's blocks pinned in the lookup's own pass.
        if (cold) evict_cpu_caches();
        const auto t11 = Clock::now();
        const auto k2 = memo.keys(tokens, {});
        const auto t12 = Clock::now();
        TieredCache::PinnedLookup both = stack->cache().lookup_pinning_top(k2);
        const auto t13 = Clock::now();
        if (both.found.blocks.size() != blocks || both.on_top.size() != blocks) std::abort();
        both.on_top.release();
        one_pass.push_back(ms_between(t12, t13));
        one_pass_total.push_back(ms_between(t11, t13));
        hash.push_back(ms_between(t0, t1));
        from_memo.push_back(ms_between(t2, t3));
        lookup.push_back(ms_between(t3, t4));
        pin.push_back(ms_between(t4, t5));
        release.push_back(ms_between(t5, t6));
        total.push_back(ms_between(t2, t5));
        sha_bytes.push_back(ms_between(t7, t8));
        finds.push_back(ms_between(t9, t10));
      }
      r.add_row({std::to_string(n), cold ? "cold" : "warm", fmt_double(median(hash), 3),
                 fmt_double(median(sha_bytes), 3), fmt_double(median(from_memo), 3),
                 fmt_double(median(lookup), 3), fmt_double(median(pin), 3),
                 fmt_double(median(finds), 3), fmt_double(median(release), 3),
                 fmt_double(median(total), 3), fmt_double(median(one_pass), 3),
                 fmt_double(median(one_pass_total), 3)});
    }
    EVP_MD_free(sha);
  }
  r.add_note(
      "31 rounds; each hashes the prompt, takes its keys from the key memo (as a repeated prompt "
      "does), looks it "
      "up, pins what it found (TieredCache::fetch of the lookup's result) and releases it, then "
      "runs the two "
      "floors on the same data, then the keys and a lookup that pins the GPU's blocks in its own "
      "pass "
      "(TieredCache::lookup_pinning_top, as CachedGenerator does). Cold: 256 MiB streamed through "
      "the CPU's "
      "caches before the memo, before each floor and before the one-pass lookup (the hash is timed "
      "warm)");
  r.print();
  r.write_json(output_path("cache_bench_gpu_hit.json"));
}

// 5. What a prompt that only the SSD holds costs the host before its plan: the GPU pool and RAM
// miss its first block, the SSD's in-memory set answers for every block (the plan table's SSD
// rows, where the plan computes everything after this lookup, so all of it is time added to the
// uncached prefill).
void bench_ssd_only_lookup() {
  auto ctx = VulkanContext::create();
  if (!ctx.ok()) {
    std::printf("cache_bench: no Vulkan device (%s): SSD lookup skipped\n",
                ctx.status().to_string().c_str());
    return;
  }
  Report r(
      "cache_bench: a prompt only the SSD holds, looked up as CachedGenerator does (SHA-256 keys), "
      "medians",
      {"prompt tokens", "CPU caches", "keys from the memo ms", "lookup pinning the GPU's ms",
       "SSD contains_many ms", "hash-set finds ms", "lookup / finds"});
  r.set_meta("machine", machine_description());
  const auto layout = bookkeeping_layout();
  for (const size_t n : {2048, 8192, 32768}) {
    const uint32_t blocks = static_cast<uint32_t>(n / 16);
    testing::TempDir dir;
    CacheStackOptions o;
    o.gpu_pool.num_blocks = 64;
    o.ram.capacity_bytes = layout->dense_block_bytes() * 3 / 2;
    o.ssd.emplace();
    o.ssd->dir = dir.str();
    o.ssd->capacity_bytes =
        std::max<uint64_t>(4ull * blocks * layout->dense_block_bytes(), 1ull << 30);
    const auto p = open_with_prompt(**ctx, o, n, 11);
    if (!p) return;
    auto& [stack, h, memo, tokens, keys] = *p;
    std::vector<BlockRef> refs;
    std::vector<BlockHash> hashes;
    for (uint32_t i = 0; i < blocks; ++i) {
      Block b = testing::make_block(layout, i);
      b.mutable_identity() = h.identity(keys, i, {});
      hashes.push_back(b.identity().hash);
      refs.push_back(std::make_shared<const Block>(std::move(b)));
    }
    for (const auto& res : stack->ssd()->insert_many(refs)) {
      if (!res.ok()) std::abort();
    }
    stack->ssd()->flush();
    refs.clear();
    // The floor, on the same hashes: one find per block in a node-based set.
    const std::unordered_set<BlockHash> set(hashes.begin(), hashes.end());
    memo.keys(tokens, {});
    for (const bool cold : {false, true}) {
      std::vector<double> from_memo, lookup, ssd_only, finds;
      for (int rep = 0; rep < 31; ++rep) {
        using Clock = std::chrono::steady_clock;
        if (cold) evict_cpu_caches();
        const auto t0 = Clock::now();
        const auto k = memo.keys(tokens, {});
        const auto t1 = Clock::now();
        TieredCache::PinnedLookup found = stack->cache().lookup_pinning_top(k);
        const auto t2 = Clock::now();
        if (found.found.blocks.size() != blocks) std::abort();
        found.on_top.release();
        if (cold) evict_cpu_caches();
        const auto t3 = Clock::now();
        const std::vector<bool> held = stack->ssd()->contains_many(hashes);
        const auto t4 = Clock::now();
        if (std::count(held.begin(), held.end(), true) != blocks) std::abort();
        if (cold) evict_cpu_caches();
        const auto t5 = Clock::now();
        size_t in_set = 0;
        for (const BlockHash& hash : hashes) in_set += set.count(hash);
        const auto t6 = Clock::now();
        if (in_set != blocks) std::abort();
        from_memo.push_back(ms_between(t0, t1));
        lookup.push_back(ms_between(t1, t2));
        ssd_only.push_back(ms_between(t3, t4));
        finds.push_back(ms_between(t5, t6));
      }
      r.add_row({std::to_string(n), cold ? "cold" : "warm", fmt_double(median(from_memo), 3),
                 fmt_double(median(lookup), 3), fmt_double(median(ssd_only), 3),
                 fmt_double(median(finds), 3), fmt_double(median(lookup) / median(finds), 1)});
    }
  }
  r.add_note(
      "31 rounds; the prompt's blocks written to the SSD tier alone (RAM holds 1.5 blocks, the "
      "GPU pool none of them); the lookup is TieredCache::lookup_pinning_top, then the SSD "
      "tier's contains_many of the same hashes alone, then the floor: a find per hash in a "
      "std::unordered_set of them. Cold: 256 MiB streamed through the CPU's caches before each");
  r.print();
  r.write_json(output_path("cache_bench_ssd_lookup.json"));
}

}  // namespace

int main() {
  keep_freed_block_memory();
  const auto llama = *layout_preset("llama-3-8b");
  const Namespace ns{"llama-3-8b", llama.fingerprint(), ""};

  // 1. Hash rate.
  Report hashes("cache_bench: prefix hashing (16-token blocks, 128k-token prompt)",
                {"hash", "median ms / 8192 blocks", "M blocks/s", "M tokens/s"});
  hashes.set_meta("machine", machine_description());
  const auto tokens = random_tokens(128 * 1024, 1);
  for (HashAlgorithm a : {HashAlgorithm::kSha256, HashAlgorithm::kXxh3}) {
    PrefixHasher h(a, ns, 16);
    Timing t = time_calls([&] {
      auto v = h.hash_prefix(tokens, {});
      asm volatile("" ::"r"(v.data()) : "memory");
    });
    const double blocks = tokens.size() / 16.0;
    hashes.add_row({std::string(hash_algorithm_name(a)), fmt_double(t.median_s * 1e3, 3),
                    fmt_double(blocks / t.median_s / 1e6), fmt_double(tokens.size() / t.median_s / 1e6)});
  }
  hashes.print();
  hashes.write_json(output_path("cache_bench_hash.json"));

  // 2. Lookup latency of a fully cached 128k-token prompt. The blocks' data do not affect a
  // lookup (it never touches them), so they use a one-layer layout to fit this machine's memory.
  Report lookups("cache_bench: lookup of a fully cached 128k-token prompt (8192 blocks, RAM tier)",
                 {"lookup", "median us", "p99 us", "matched tokens"});
  lookups.set_meta("machine", machine_description());
  {
    auto small = testing::share(KvLayout::uniform("one-layer", 1, 1, 8, 16, DType::kBF16));
    RamTierOptions o;
    o.capacity_bytes = 1ull << 30;
    auto ram = std::make_shared<RamTier>(o);
    TieredCache cache({ram});
    for (HashAlgorithm a : {HashAlgorithm::kSha256, HashAlgorithm::kXxh3}) {
      PrefixHasher h(a, Namespace{"bench", small->fingerprint(), ""}, 16);
      auto keys = h.keys(tokens, {});
      for (size_t i = 0; i < keys.size(); ++i) {
        Block b = Block::dense(small, h.identity(keys, i, {}));
        (void)cache.insert(std::make_shared<const Block>(std::move(b)));
      }
      size_t matched = 0;
      std::vector<double> from_tokens, from_keys;
      for (int r = 0; r < 201; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        matched = cache.lookup(h, tokens, {}).matched_tokens;
        auto t1 = std::chrono::steady_clock::now();
        matched = std::min(matched, cache.lookup(keys).matched_tokens);
        auto t2 = std::chrono::steady_clock::now();
        from_tokens.push_back(std::chrono::duration<double>(t1 - t0).count());
        from_keys.push_back(std::chrono::duration<double>(t2 - t1).count());
      }
      const std::string name(hash_algorithm_name(a));
      lookups.add_row({"tokens -> hits (" + name + ")", fmt_double(percentile(from_tokens, 0.5) * 1e6, 1),
                       fmt_double(percentile(from_tokens, 0.99) * 1e6, 1), std::to_string(matched)});
      lookups.add_row({"keys -> hits (" + name + " hashes precomputed)",
                       fmt_double(percentile(from_keys, 0.5) * 1e6, 1),
                       fmt_double(percentile(from_keys, 0.99) * 1e6, 1), std::to_string(matched)});
    }
  }
  lookups.add_note("201 lookups each; p99 is the 99th percentile of those samples");
  lookups.print();
  lookups.write_json(output_path("cache_bench_lookup.json"));

  // 3. Insert / fetch throughput in the RAM tier.
  Report tput("cache_bench: RAM tier insert/fetch, Llama-3-8B blocks (" +
                  format_byte_size(llama.dense_block_bytes()) + " each, bf16)",
              {"operation", "median ms / 256 blocks", "GB/s", "vs memcpy"});
  tput.set_meta("machine", machine_description());
  {
    auto layout = testing::share(llama);
    PrefixHasher h(HashAlgorithm::kSha256, ns, 16);
    const auto prompt_tokens = random_tokens(256 * 16, 2);
    auto keys = h.keys(prompt_tokens, {});
    std::vector<BlockRef> blocks;
    for (size_t i = 0; i < keys.size(); ++i) {
      Block b = testing::make_block(layout, i);
      b.mutable_identity() = h.identity(keys, i, {});
      blocks.push_back(std::make_shared<const Block>(std::move(b)));
    }
    const double bytes = static_cast<double>(blocks.size() * llama.dense_block_bytes());
    AlignedBuffer dst(llama.dense_block_bytes() * blocks.size(), 64, /*zeroed=*/true);
    Timing copy = time_calls([&] {
      for (size_t i = 0; i < blocks.size(); ++i) {
        std::memcpy(dst.data() + i * llama.dense_block_bytes(), blocks[i]->data().data(),
                    llama.dense_block_bytes());
      }
    }, 7);
    const double memcpy_gbps = bytes / copy.median_s / 1e9;
    tput.add_row({"memcpy of the same bytes (reference)", fmt_double(copy.median_s * 1e3, 2),
                  fmt_double(memcpy_gbps), "1.00"});

    RamTierOptions o;
    o.capacity_bytes = 2ull << 30;
    auto ram = std::make_shared<RamTier>(o);
    TieredCache cache({ram});
    Timing ins = time_calls([&] {
      for (const auto& b : blocks) (void)cache.erase(b->hash());
      for (const auto& b : blocks) (void)cache.insert(b);
    }, 7);
    Timing fetch = time_calls([&] {
      PinnedBlocks p = cache.fetch(keys);
      if (p.size() != keys.size()) std::abort();
    }, 7);
    Timing copy_in = time_calls([&] {
      for (const auto& b : blocks) (void)cache.erase(b->hash());
      for (const auto& b : blocks) (void)cache.insert(std::make_shared<const Block>(b->clone()));
    }, 7);
    auto row = [&](const std::string& name, const Timing& t) {
      const double gbps = bytes / t.median_s / 1e9;
      tput.add_row({name, fmt_double(t.median_s * 1e3, 2), fmt_double(gbps),
                    fmt_double(gbps / memcpy_gbps)});
    };
    row("insert (erase + publish, shared handle)", ins);
    row("fetch (pin + hand out, shared handle)", fetch);
    row("insert with copy-in (clone + publish)", copy_in);
  }
  tput.add_note("the RAM tier stores and hands out shared immutable blocks: insert and fetch move no "
                "block bytes, so their GB/s is bookkeeping per block expressed per byte");
  tput.print();
  tput.write_json(output_path("cache_bench_ram.json"));
  bench_gpu_hit_bookkeeping();
  bench_ssd_only_lookup();
  return 0;
}
