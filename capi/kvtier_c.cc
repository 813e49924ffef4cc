// The C ABI over EmbeddedCache: argument checks for what C cannot express (NULL pointers, lengths),
// Status codes as kvtier_status, messages kept per thread, and no exception ever crossing into C.
#include "capi/kvtier.h"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "inprocess/embedded_cache.h"

struct kvtier_options {
  kvtier::EmbeddedCacheOptions o;
};

struct kvtier_cache {
  std::unique_ptr<kvtier::EmbeddedCache> c;
};

namespace {

using kvtier::Status;
using kvtier::StatusCode;

thread_local std::string g_last_error;

kvtier_status code_of(StatusCode c) {
  switch (c) {
    case StatusCode::kOk: return KVTIER_OK;
    case StatusCode::kInvalidArgument: return KVTIER_INVALID_ARGUMENT;
    case StatusCode::kNotFound: return KVTIER_NOT_FOUND;
    case StatusCode::kAlreadyExists: return KVTIER_FAILED_PRECONDITION;
    case StatusCode::kCorruption: return KVTIER_CORRUPTION;
    case StatusCode::kIoError: return KVTIER_IO_ERROR;
    case StatusCode::kNoSpace: return KVTIER_NO_SPACE;
    case StatusCode::kResourceExhausted: return KVTIER_RESOURCE_EXHAUSTED;
    case StatusCode::kFailedPrecondition: return KVTIER_FAILED_PRECONDITION;
    case StatusCode::kUnavailable: return KVTIER_UNAVAILABLE;
    case StatusCode::kConflict: return KVTIER_CONFLICT;
    case StatusCode::kInternal: return KVTIER_INTERNAL;
    case StatusCode::kPermissionDenied: return KVTIER_PERMISSION_DENIED;
  }
  return KVTIER_INTERNAL;
}

kvtier_status fail(kvtier_status code, std::string message) {
  g_last_error = std::move(message);
  return code;
}

kvtier_status report(const Status& st) {
  if (st.ok()) {
    g_last_error.clear();
    return KVTIER_OK;
  }
  return fail(code_of(st.code()), st.message());
}

// Runs `f` (returning kvtier_status) with every exception turned into a status: nothing may unwind
// into a C caller.
template <typename F>
kvtier_status guarded(F&& f) noexcept {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return fail(KVTIER_RESOURCE_EXHAUSTED, "out of memory");
  } catch (const std::exception& e) {
    return fail(KVTIER_INTERNAL, e.what());
  }
}

#define KVTIER_REQUIRE(cond, what) \
  if (!(cond)) return fail(KVTIER_INVALID_ARGUMENT, what)

std::vector<std::string> extra_keys_of(const char* const* keys, size_t n) {
  std::vector<std::string> out;
  for (size_t i = 0; i < n; ++i) out.emplace_back(keys[i] ? keys[i] : "");
  return out;
}

// What is wrong with a prompt's pointers, or null.
const char* prompt_error(const kvtier_prompt* p) {
  if (!p) return "prompt is NULL";
  if (!p->tokens && p->n_tokens != 0) return "prompt->tokens is NULL";
  if (!p->extra_keys && p->n_extra_keys != 0) return "prompt->extra_keys is NULL";
  return nullptr;
}

// A kvtier_prompt as EmbeddedCache takes it (the extra keys copied into strings).
struct PromptArgs {
  std::span<const uint32_t> tokens;
  std::vector<std::string> extra_keys;
  kvtier::Prompt prompt() const { return {tokens, extra_keys}; }
};

PromptArgs prompt_args(const kvtier_prompt& p) {
  return {{p.tokens, p.n_tokens}, extra_keys_of(p.extra_keys, p.n_extra_keys)};
}

kvtier::BlockHash hash_of(const uint8_t* bytes) {
  kvtier::BlockHash h;
  std::memcpy(h.bytes.data(), bytes, KVTIER_HASH_BYTES);
  return h;
}

kvtier_tier tier_of(const std::string& name) {
  if (name == "gpu") return KVTIER_TIER_GPU;
  if (name == "ram") return KVTIER_TIER_RAM;
  return KVTIER_TIER_SSD;
}

template <typename Setter>
kvtier_status set_option(kvtier_options* options, Setter&& set) {
  return guarded([&] {
    KVTIER_REQUIRE(options, "options is NULL");
    return set(options->o);
  });
}

kvtier_status set_bytes(kvtier_options* options, uint64_t value, uint64_t kvtier::EmbeddedCacheOptions::*field) {
  return set_option(options, [&](kvtier::EmbeddedCacheOptions& o) {
    o.*field = value;
    return KVTIER_OK;
  });
}

kvtier_status set_string(kvtier_options* options, const char* value, std::string kvtier::EmbeddedCacheOptions::*field,
                         const char* name) {
  return set_option(options, [&](kvtier::EmbeddedCacheOptions& o) {
    KVTIER_REQUIRE(value, std::string(name) + " is NULL");
    o.*field = value;
    return report(kvtier::ok_status());
  });
}

}  // namespace

extern "C" {

int kvtier_version(void) { return KVTIER_VERSION; }

const char* kvtier_last_error(void) { return g_last_error.c_str(); }

const char* kvtier_status_name(kvtier_status s) {
  switch (s) {
    case KVTIER_OK: return "OK";
    case KVTIER_INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case KVTIER_NOT_FOUND: return "NOT_FOUND";
    case KVTIER_CORRUPTION: return "CORRUPTION";
    case KVTIER_IO_ERROR: return "IO_ERROR";
    case KVTIER_NO_SPACE: return "NO_SPACE";
    case KVTIER_RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case KVTIER_FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case KVTIER_UNAVAILABLE: return "UNAVAILABLE";
    case KVTIER_CONFLICT: return "CONFLICT";
    case KVTIER_INTERNAL: return "INTERNAL";
    case KVTIER_PERMISSION_DENIED: return "PERMISSION_DENIED";
  }
  return "UNKNOWN";
}

void kvtier_free(void* p) { std::free(p); }

kvtier_options* kvtier_options_create(void) { return new (std::nothrow) kvtier_options(); }
void kvtier_options_destroy(kvtier_options* options) { delete options; }

kvtier_status kvtier_options_set_layout(kvtier_options* options, const char* layout) {
  return set_string(options, layout, &kvtier::EmbeddedCacheOptions::layout, "layout");
}
kvtier_status kvtier_options_set_hybrid_layout(kvtier_options* options, const char* hybrid_layout) {
  return set_string(options, hybrid_layout, &kvtier::EmbeddedCacheOptions::hybrid_layout, "hybrid layout");
}
kvtier_status kvtier_options_set_namespace(kvtier_options* options, const char* ns) {
  return set_string(options, ns, &kvtier::EmbeddedCacheOptions::ns, "namespace");
}
kvtier_status kvtier_options_set_hash(kvtier_options* options, const char* hash) {
  return set_string(options, hash, &kvtier::EmbeddedCacheOptions::hash, "hash");
}
kvtier_status kvtier_options_set_ssd_dir(kvtier_options* options, const char* dir) {
  return set_option(options, [&](kvtier::EmbeddedCacheOptions& o) {
    KVTIER_REQUIRE(dir, "ssd dir is NULL");
    o.ssd_dirs = {dir};
    return report(kvtier::ok_status());
  });
}
kvtier_status kvtier_options_add_ssd_dir(kvtier_options* options, const char* dir) {
  return set_option(options, [&](kvtier::EmbeddedCacheOptions& o) {
    KVTIER_REQUIRE(dir, "ssd dir is NULL");
    o.ssd_dirs.push_back(dir);
    return report(kvtier::ok_status());
  });
}
kvtier_status kvtier_options_set_remote(kvtier_options* options, const char* url) {
  return set_string(options, url, &kvtier::EmbeddedCacheOptions::remote, "remote");
}
kvtier_status kvtier_options_set_kv_events(kvtier_options* options, const char* endpoint) {
  return set_string(options, endpoint, &kvtier::EmbeddedCacheOptions::kv_events,
                    "kv events endpoint");
}
kvtier_status kvtier_options_set_kv_events_replay(kvtier_options* options, const char* endpoint) {
  return set_string(options, endpoint, &kvtier::EmbeddedCacheOptions::kv_events_replay,
                    "kv events replay endpoint");
}
kvtier_status kvtier_options_set_ram_capacity(kvtier_options* options, uint64_t bytes) {
  return set_bytes(options, bytes, &kvtier::EmbeddedCacheOptions::ram_capacity);
}
kvtier_status kvtier_options_set_ssd_capacity(kvtier_options* options, uint64_t bytes) {
  return set_bytes(options, bytes, &kvtier::EmbeddedCacheOptions::ssd_capacity);
}
kvtier_status kvtier_options_set_ssd_segment_size(kvtier_options* options, uint64_t bytes) {
  return set_bytes(options, bytes, &kvtier::EmbeddedCacheOptions::ssd_segment_size);
}
kvtier_status kvtier_options_set_kv_cache_quantization(kvtier_options* options, int bits) {
  return set_option(options, [&](kvtier::EmbeddedCacheOptions& o) {
    KVTIER_REQUIRE(bits == 0 || bits == 4 || bits == 8,
                   "kv cache quantization is 0 (off), 8 or 4 bits, not " + std::to_string(bits));
    o.kv_cache_quantization = bits == 0 ? std::nullopt : std::optional<int>(bits);
    return KVTIER_OK;
  });
}
kvtier_status kvtier_options_set_gpu_memory(kvtier_options* options, uint64_t bytes) {
  return set_bytes(options, bytes, &kvtier::EmbeddedCacheOptions::gpu_memory);
}
kvtier_status kvtier_options_set_persist_on_close(kvtier_options* options, int persist) {
  return set_option(options, [&](kvtier::EmbeddedCacheOptions& o) {
    o.persist_on_close = persist != 0;
    return KVTIER_OK;
  });
}

kvtier_status kvtier_options_set_ssd_admission(kvtier_options* options, const char* rule) {
  return set_string(options, rule, &kvtier::EmbeddedCacheOptions::ssd_admission,
                    "ssd admission rule");
}
kvtier_status kvtier_options_set_ssd_write_budget(kvtier_options* options, uint64_t bytes_per_day) {
  return set_bytes(options, bytes_per_day, &kvtier::EmbeddedCacheOptions::ssd_write_budget);
}

kvtier_status kvtier_options_set_cuda_device(kvtier_options* options, int device) {
  return set_option(options, [&](kvtier::EmbeddedCacheOptions& o) {
    if (device < 0)
      return fail(KVTIER_INVALID_ARGUMENT, "cuda_device must be a CUDA ordinal (>= 0)");
    o.cuda_device = device;
    return KVTIER_OK;
  });
}

kvtier_status kvtier_open(const kvtier_options* options, kvtier_cache** cache) {
  return guarded([&] {
    KVTIER_REQUIRE(cache, "cache is NULL");
    *cache = nullptr;
    KVTIER_REQUIRE(options, "options is NULL");
    auto c = kvtier::EmbeddedCache::open(options->o);
    if (!c.ok()) return report(c.status());
    *cache = new kvtier_cache{std::move(c).value()};
    return report(kvtier::ok_status());
  });
}

void kvtier_close(kvtier_cache* cache, size_t* blocks_lost) {
  if (blocks_lost) *blocks_lost = 0;
  if (!cache) return;
  const size_t lost = cache->c->close();
  if (blocks_lost) *blocks_lost = lost;
  delete cache;
}

size_t kvtier_block_size(const kvtier_cache* cache) {
  return cache ? static_cast<size_t>(cache->c->layout().block_size) : 0;
}
size_t kvtier_block_bytes(const kvtier_cache* cache) { return cache ? cache->c->block_bytes() : 0; }

kvtier_status kvtier_lookup(kvtier_cache* cache, const kvtier_prompt* prompt, kvtier_cached_block* blocks,
                            size_t capacity, size_t* n_blocks) {
  return guarded([&] {
    KVTIER_REQUIRE(cache && n_blocks, "cache or n_blocks is NULL");
    KVTIER_REQUIRE(blocks || capacity == 0, "blocks is NULL");
    if (const char* bad = prompt_error(prompt)) return fail(KVTIER_INVALID_ARGUMENT, bad);
    const PromptArgs p = prompt_args(*prompt);
    auto m = cache->c->lookup(p.prompt());
    if (!m.ok()) return report(m.status());
    *n_blocks = m->blocks.size();
    for (size_t i = 0; i < m->blocks.size() && i < capacity; ++i) {
      std::memcpy(blocks[i].hash, m->blocks[i].hash.bytes.data(), KVTIER_HASH_BYTES);
      blocks[i].tier = tier_of(m->blocks[i].tier);
    }
    return report(kvtier::ok_status());
  });
}

kvtier_status kvtier_store_block(kvtier_cache* cache, const kvtier_prompt* block, const uint8_t* parent_hash,
                                 const void* data, size_t data_len, uint8_t* hash_out, int* inserted) {
  return guarded([&] {
    KVTIER_REQUIRE(cache && block && block->tokens && data, "cache, block, block->tokens or data is NULL");
    if (const char* bad = prompt_error(block)) return fail(KVTIER_INVALID_ARGUMENT, bad);
    const PromptArgs p = prompt_args(*block);
    std::optional<kvtier::BlockHash> parent;
    if (parent_hash) parent = hash_of(parent_hash);
    auto r = cache->c->store_bytes(p.prompt(), parent,
                                   {static_cast<const uint8_t*>(data), data_len});
    if (!r.ok()) return report(r.status());
    if (hash_out) std::memcpy(hash_out, r->hash.bytes.data(), KVTIER_HASH_BYTES);
    if (inserted) *inserted = r->inserted ? 1 : 0;
    return report(kvtier::ok_status());
  });
}

kvtier_status kvtier_load_block(kvtier_cache* cache, const uint8_t* hash, const uint32_t* tokens,
                                size_t n_tokens, void* dst, size_t dst_len, int* found) {
  return guarded([&] {
    KVTIER_REQUIRE(cache && hash && dst && found, "cache, hash, dst or found is NULL");
    KVTIER_REQUIRE(tokens || n_tokens == 0, "tokens is NULL");
    *found = 0;
    auto r = cache->c->load_block_bytes(hash_of(hash), {tokens, n_tokens},
                                        {static_cast<uint8_t*>(dst), dst_len});
    if (!r.ok()) return report(r.status());
    *found = *r ? 1 : 0;
    return report(kvtier::ok_status());
  });
}

kvtier_status kvtier_load_prefix(kvtier_cache* cache, const kvtier_prompt* prompt, size_t first_block,
                                 size_t max_blocks, int64_t timeout_ms, void* dst, size_t dst_len, size_t* loaded,
                                 int* deadline_passed) {
  return guarded([&] {
    KVTIER_REQUIRE(cache && loaded, "cache or loaded is NULL");
    KVTIER_REQUIRE(dst || dst_len == 0, "dst is NULL");
    if (const char* bad = prompt_error(prompt)) return fail(KVTIER_INVALID_ARGUMENT, bad);
    const PromptArgs p = prompt_args(*prompt);
    *loaded = 0;
    if (deadline_passed) *deadline_passed = 0;
    kvtier::LoadOptions o{first_block, std::nullopt};
    if (timeout_ms >= 0) o.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    auto r = cache->c->load_prefix_bytes(p.prompt(), o, max_blocks,
                                         {static_cast<uint8_t*>(dst), dst_len});
    if (!r.ok()) return report(r.status());
    *loaded = r->loaded_blocks;
    if (deadline_passed) *deadline_passed = r->deadline_passed ? 1 : 0;
    return report(kvtier::ok_status());
  });
}

kvtier_status kvtier_plan(kvtier_cache* cache, const kvtier_prompt* prompt, int policy,
                          kvtier_prefill_plan* plan) {
  return guarded([&] {
    KVTIER_REQUIRE(cache && plan, "cache or plan is NULL");
    if (const char* bad = prompt_error(prompt)) return fail(KVTIER_INVALID_ARGUMENT, bad);
    kvtier::PlanPolicy p;
    switch (policy) {
      case KVTIER_PLAN_COST:
        p = kvtier::PlanPolicy::kCost;
        break;
      case KVTIER_PLAN_LOAD:
        p = kvtier::PlanPolicy::kLoad;
        break;
      case KVTIER_PLAN_COMPUTE:
        p = kvtier::PlanPolicy::kCompute;
        break;
      default:
        return fail(KVTIER_INVALID_ARGUMENT, "policy is not KVTIER_PLAN_COST, _LOAD or _COMPUTE");
    }
    const PromptArgs args = prompt_args(*prompt);
    auto r = cache->c->plan_prefill(args.prompt(), p);
    if (!r.ok()) return report(r.status());
    const kvtier::PrefillPlan& h = *r;
    *plan = kvtier_prefill_plan{};
    plan->cached_blocks = h.cached_blocks;
    plan->compute_blocks = h.compute_blocks;
    plan->timeout_ms = h.deadline ? static_cast<int64_t>(std::ceil(*h.deadline * 1e3)) : -1;
    plan->predicted_seconds = h.predicted.value_or(-1);
    plan->load_only_seconds = h.load_only.value_or(-1);
    plan->compute_only_seconds = h.compute_only.value_or(-1);
    plan->probe = h.probe ? 1 : 0;
    plan->overlap_alone_seconds = h.overlap_alone.value_or(-1);
    return report(kvtier::ok_status());
  });
}

kvtier_status kvtier_observe_prefill(kvtier_cache* cache, uint64_t tokens, uint64_t context,
                                     double seconds) {
  return guarded([&] {
    KVTIER_REQUIRE(cache, "cache is NULL");
    return report(cache->c->observe_prefill(tokens, context, seconds));
  });
}

kvtier_status kvtier_observe_split(kvtier_cache* cache, const kvtier_prefill_plan* plan,
                                   double seconds) {
  return guarded([&] {
    KVTIER_REQUIRE(cache && plan, "cache or plan is NULL");
    kvtier::PrefillPlan h;
    h.cached_blocks = plan->cached_blocks;
    h.compute_blocks = plan->compute_blocks;
    if (plan->overlap_alone_seconds > 0) h.overlap_alone = plan->overlap_alone_seconds;
    return report(cache->c->observe_split(h, seconds));
  });
}

size_t kvtier_state_bytes(const kvtier_cache* cache) {
  if (!cache) return 0;
  const kvtier::HybridLayout* h = cache->c->hybrid_layout();
  return h ? h->snapshot_bytes() : 0;
}

kvtier_status kvtier_store_state(kvtier_cache* cache, const kvtier_prompt* prompt, const void* snapshot,
                                 size_t len, int* inserted) {
  return guarded([&] {
    KVTIER_REQUIRE(cache && snapshot, "cache or snapshot is NULL");
    if (const char* bad = prompt_error(prompt)) return fail(KVTIER_INVALID_ARGUMENT, bad);
    const PromptArgs p = prompt_args(*prompt);
    if (inserted) *inserted = 0;
    auto r = cache->c->store_state(p.prompt(),
                                   std::span<const uint8_t>(static_cast<const uint8_t*>(snapshot), len));
    if (!r.ok()) return report(r.status());
    if (inserted) *inserted = *r ? 1 : 0;
    return report(kvtier::ok_status());
  });
}

kvtier_status kvtier_fetch_state(kvtier_cache* cache, const kvtier_prompt* prompt, void* dst, size_t dst_len,
                                 int* found) {
  return guarded([&] {
    KVTIER_REQUIRE(cache && dst && found, "cache, dst or found is NULL");
    if (const char* bad = prompt_error(prompt)) return fail(KVTIER_INVALID_ARGUMENT, bad);
    const PromptArgs p = prompt_args(*prompt);
    *found = 0;
    const size_t want = kvtier_state_bytes(cache);
    if (want != 0 && dst_len != want) {
      return fail(KVTIER_INVALID_ARGUMENT, "dst_len " + std::to_string(dst_len) + " is not the state's " +
                                               std::to_string(want) + " bytes");
    }
    auto r = cache->c->fetch_state(p.prompt());
    if (!r.ok()) return report(r.status());
    if (*r) {
      std::memcpy(dst, (*r)->data(), (*r)->size());
      *found = 1;
    }
    return report(kvtier::ok_status());
  });
}

kvtier_status kvtier_stats_json(kvtier_cache* cache, char** json) {
  return guarded([&] {
    KVTIER_REQUIRE(cache && json, "cache or json is NULL");
    *json = nullptr;
    auto text = cache->c->stats_json();
    if (!text.ok()) return report(text.status());
    char* out = static_cast<char*>(std::malloc(text->size() + 1));
    if (!out) return fail(KVTIER_RESOURCE_EXHAUSTED, "out of memory");
    std::memcpy(out, text->c_str(), text->size() + 1);
    *json = out;
    return report(kvtier::ok_status());
  });
}

}  // extern "C"
