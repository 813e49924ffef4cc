/* kvtier.h: the C ABI of kvtier, a tiered (GPU -> RAM -> SSD) KV cache for LLM inference, for
 * engines written in C, Rust, Swift or Go. One cache serves one model (its KV layout) in one
 * namespace and hashes prompts exactly as kvtierd does, so blocks stored here are hits over
 * kvtierd's HTTP API on the same SSD directory, and back.
 *
 * Conventions: every name starts with kvtier_; handles are opaque; every call that can fail
 * returns a kvtier_status, and kvtier_last_error() gives its message; lengths are explicit; a
 * miss is not an error (an out-parameter says found or not). A kvtier_cache may be used from
 * several threads at once; a kvtier_options may not. Link with -lkvtier (pkg-config kvtier).
 */
#ifndef KVTIER_H_
#define KVTIER_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVTIER_VERSION_MAJOR 0
#define KVTIER_VERSION_MINOR 2
#define KVTIER_VERSION_PATCH 0
#define KVTIER_VERSION (KVTIER_VERSION_MAJOR * 10000 + KVTIER_VERSION_MINOR * 100 + KVTIER_VERSION_PATCH)

/* The library's KVTIER_VERSION, to catch a header that does not match the library at run time. */
int kvtier_version(void);

/* A block hash: SHA-256 (or xxh3-128 in the first 16 bytes, the rest zero). */
#define KVTIER_HASH_BYTES 32

typedef enum kvtier_status {
  KVTIER_OK = 0,
  KVTIER_INVALID_ARGUMENT = 1,    /* malformed input: sizes, token counts, a bad option */
  KVTIER_NOT_FOUND = 2,           /* a file or preset named in the options does not exist */
  KVTIER_CORRUPTION = 3,          /* stored bytes failed a check */
  KVTIER_IO_ERROR = 4,
  KVTIER_NO_SPACE = 5,
  KVTIER_RESOURCE_EXHAUSTED = 6,  /* no tier had room (everything pinned) */
  KVTIER_FAILED_PRECONDITION = 7, /* the cache is closed; a directory locked by another process */
  KVTIER_UNAVAILABLE = 8,         /* no Vulkan device for a GPU tier */
  KVTIER_CONFLICT = 9,            /* another block with other tokens holds this hash */
  KVTIER_INTERNAL = 10,
  KVTIER_PERMISSION_DENIED = 11   /* not allowed to use this namespace */
} kvtier_status;

/* The message of the last call on this thread that failed ("" if none). Valid until the next
 * kvtier call on the same thread; the library owns it. */
const char* kvtier_last_error(void);
/* "OK", "INVALID_ARGUMENT", ...; static storage. */
const char* kvtier_status_name(kvtier_status status);

/* Releases memory the library handed out (kvtier_stats_json). NULL is a no-op. */
void kvtier_free(void* p);

/* ---- Options: created, set, passed to kvtier_open, destroyed by the caller. ---- */
typedef struct kvtier_options kvtier_options;

/* Defaults: layout "llama-3-8b", namespace "default", hash "sha256", 1 GiB of RAM, no SSD tier,
 * no GPU tier, blocks only RAM holds written to the SSD on close. NULL when out of memory. */
kvtier_options* kvtier_options_create(void);
void kvtier_options_destroy(kvtier_options* options);
/* A preset ("llama-3-8b", "qwen3-0.6b", "tiny"), a layout JSON file, or layout JSON text. */
kvtier_status kvtier_options_set_layout(kvtier_options* options, const char* layout);
/* A hybrid model (Gated DeltaNet layers beside attention): its layout as JSON text or a file path
 * (docs/python.md, "Hybrid models"). It replaces the layout with its attention layers'; lookups and
 * loads then end at the last block with a state snapshot (kvtier_store_state). */
kvtier_status kvtier_options_set_hybrid_layout(kvtier_options* options, const char* hybrid_layout);
kvtier_status kvtier_options_set_namespace(kvtier_options* options, const char* ns);
/* "sha256" or "xxh3". */
kvtier_status kvtier_options_set_hash(kvtier_options* options, const char* hash);
kvtier_status kvtier_options_set_ram_capacity(kvtier_options* options, uint64_t bytes);
/* Turns the SSD tier on, in this one directory (replacing any set before). */
kvtier_status kvtier_options_set_ssd_dir(kvtier_options* options, const char* dir);
/* One more SSD directory (one per drive): the tier stripes its blocks over all of them, splitting
 * the SSD capacity evenly, and a directory that is lost costs only its own blocks. */
kvtier_status kvtier_options_add_ssd_dir(kvtier_options* options, const char* dir);
kvtier_status kvtier_options_set_ssd_capacity(kvtier_options* options, uint64_t bytes);
/* Segment files of a new SSD directory (default 256 MiB; capacity must hold two). */
kvtier_status kvtier_options_set_ssd_segment_size(kvtier_options* options, uint64_t bytes);
/* Which blocks leaving RAM the SSD writes: "all" (default) or "seen-twice" (blocks used twice),
 * kvtierd's --ssd-admission. Checked by kvtier_open. */
kvtier_status kvtier_options_set_ssd_admission(kvtier_options* options, const char* rule);
/* Bytes a day the SSD tier may write (a drive's warranted drive-writes per day); 0 = no budget
 * (default). Admission tightens as it runs out, counted (kvtierd's --ssd-write-budget). */
kvtier_status kvtier_options_set_ssd_write_budget(kvtier_options* options, uint64_t bytes_per_day);
/* 0 = off (default), 8 or 4: keep blocks quantized in RAM (lossy; group size 64). */
kvtier_status kvtier_options_set_kv_cache_quantization(kvtier_options* options, int bits);
/* Bytes of a GPU tier (a Vulkan device) on top; 0 = none (default). */
kvtier_status kvtier_options_set_gpu_memory(kvtier_options* options, uint64_t bytes);
/* "redis://[user:password@]host:port[,host:port...]": a Redis Cluster shared with other hosts,
 * below the SSD (kvtierd's --remote). */
kvtier_status kvtier_options_set_remote(kvtier_options* options, const char* url);
/* A ZeroMQ endpoint to bind ("tcp://127.0.0.1:5557"), on which every block entering and leaving a
 * tier is published in vLLM's KV-event format for prefix-aware routers (kvtierd's --kv-events);
 * and the replay socket's, for subscribers that missed batches. Default: none. */
kvtier_status kvtier_options_set_kv_events(kvtier_options* options, const char* endpoint);
kvtier_status kvtier_options_set_kv_events_replay(kvtier_options* options, const char* endpoint);
/* Nonzero (default): kvtier_close writes blocks only RAM holds to the SSD. */
kvtier_status kvtier_options_set_persist_on_close(kvtier_options* options, int persist);
/* The CUDA device whose engine the cache serves: kvtier_open maps the RAM tier's budget (and an
 * eighth more) and page-locks it before it returns, so that page-locking never stalls the engine's
 * streams later.
 * Needs the CUDA driver; device < 0: KVTIER_INVALID_ARGUMENT. */
kvtier_status kvtier_options_set_cuda_device(kvtier_options* options, int device);

/* ---- The cache. ---- */
typedef struct kvtier_cache kvtier_cache;

/* Opens the tiers the options describe (recovering an SSD directory). On success *cache is a
 * handle to close with kvtier_close; on failure it is NULL. */
kvtier_status kvtier_open(const kvtier_options* options, kvtier_cache** cache);
/* Writes what only RAM holds to the SSD (unless turned off), drains the SSD writer and frees the
 * handle. *blocks_lost (may be NULL) receives the number of blocks that were not written durably
 * (a full disk, an I/O error, the close timeout): 0 means a reopen serves every block. Waits for
 * calls in flight on other threads; NULL is a no-op. */
void kvtier_close(kvtier_cache* cache, size_t* blocks_lost);

/* Tokens per block, and bytes of one dense block: every layer's K then V, each
 * [block_size, kv_heads, head_dim] row-major in the layer's dtype (bf16 as its raw words). */
size_t kvtier_block_size(const kvtier_cache* cache);
size_t kvtier_block_bytes(const kvtier_cache* cache);

typedef enum kvtier_tier { KVTIER_TIER_GPU = 0, KVTIER_TIER_RAM = 1, KVTIER_TIER_SSD = 2 } kvtier_tier;

typedef struct kvtier_cached_block {
  uint8_t hash[KVTIER_HASH_BYTES];
  kvtier_tier tier;
} kvtier_cached_block;

/* A prompt as the cache hashes it: `n_tokens` token ids (`tokens` NULL only when 0) and
 * `n_extra_keys` NUL-terminated strings (`extra_keys` NULL when 0) that take part in every block's
 * hash, e.g. a LoRA id or a cache salt. Borrowed for the duration of a call. */
typedef struct kvtier_prompt {
  const uint32_t* tokens;
  size_t n_tokens;
  const char* const* extra_keys;
  size_t n_extra_keys;
} kvtier_prompt;

/* The longest cached prefix of the prompt (full blocks only). Writes the first `capacity` cached
 * blocks to `blocks` (NULL when capacity is 0) and the number of cached blocks to *n_blocks (which
 * may exceed capacity). */
kvtier_status kvtier_lookup(kvtier_cache* cache, const kvtier_prompt* prompt, kvtier_cached_block* blocks,
                            size_t capacity, size_t* n_blocks);

/* Stores one block: the prompt's `n_tokens` (= block size) token ids following the block
 * `parent_hash` (KVTIER_HASH_BYTES bytes, or NULL for a prompt's first block), and its dense bytes
 * (`data_len` = kvtier_block_bytes). Writes the block's hash to `hash_out` (may be NULL) and to
 * *inserted (may be NULL) 1 for a new block, 0 for one already cached. Nothing is stored on
 * failure. */
kvtier_status kvtier_store_block(kvtier_cache* cache, const kvtier_prompt* block, const uint8_t* parent_hash,
                                 const void* data, size_t data_len, uint8_t* hash_out, int* inserted);

/* Copies the block `hash` into `dst` (`dst_len` = kvtier_block_bytes), dequantized if it was
 * held quantized. With `tokens` (NULL when n_tokens is 0) the block's token ids must equal them.
 * *found is 1 on a hit, 0 on a miss; `dst` is unchanged on a miss. */
kvtier_status kvtier_load_block(kvtier_cache* cache, const uint8_t* hash, const uint32_t* tokens,
                                size_t n_tokens, void* dst, size_t dst_len, int* found);

/* Loads part of the cached prefix of the prompt: blocks first_block, first_block + 1, ... (at most
 * max_blocks, in order, dense, one after another) into `dst` (`dst_len` at least max_blocks *
 * kvtier_block_bytes). An engine computes blocks before first_block while these load, as kvtier's
 * own generator plans a hit. With timeout_ms >= 0, slices not in by then are not waited for (they
 * finish loading in the background). *loaded is the number of blocks written from dst's start;
 * *deadline_passed (may be NULL) is 1 when the cached run went on past them but was not in time.
 * The engine computes from block first_block + *loaded on. */
kvtier_status kvtier_load_prefix(kvtier_cache* cache, const kvtier_prompt* prompt, size_t first_block,
                                 size_t max_blocks, int64_t timeout_ms, void* dst, size_t dst_len, size_t* loaded,
                                 int* deadline_passed);

/* Hit plans for the engine (the Python module's Cache.plan): how many blocks of the prompt's cached
 * prefix to compute while the rest loads. The engine computes blocks [0, compute_blocks) while
 * kvtier_load_prefix(first_block = compute_blocks, timeout_ms = the plan's) brings the rest of
 * [compute_blocks, cached_blocks) — on another thread: the call returns when the blocks are in —
 * then computes from first_block + *loaded on. The prefix stops short of the prompt's last token.
 * Seconds are predictions, negative where not known yet; timeout_ms is -1 where nothing loads or no
 * estimate exists (then wait however long it takes). KVTIER_PLAN_COST plans a pure load until the
 * engine has told three prefill times (kvtier_observe_prefill) and a load from each tier has been
 * timed (kvtier_load_prefix times its pure loads itself). */
typedef enum kvtier_plan_policy {
  KVTIER_PLAN_COST = 0,
  KVTIER_PLAN_LOAD = 1,
  KVTIER_PLAN_COMPUTE = 2
} kvtier_plan_policy;
typedef struct kvtier_prefill_plan {
  size_t cached_blocks;
  size_t compute_blocks;
  int64_t timeout_ms;
  double predicted_seconds;
  double load_only_seconds;
  double compute_only_seconds;
  int probe; /* 1: a plan that loads (or splits) against its own estimates, to time them again */
  double overlap_alone_seconds; /* the planner's own, read back by kvtier_observe_split */
} kvtier_prefill_plan;
/* `policy` is a kvtier_plan_policy, passed as an int so that any other value is an error, not
 * undefined behaviour on the library's side. */
kvtier_status kvtier_plan(kvtier_cache* cache, const kvtier_prompt* prompt, int policy,
                          kvtier_prefill_plan* plan);
/* The engine computed `tokens` prompt rows after `context` cached ones in `seconds` (> 0). */
kvtier_status kvtier_observe_prefill(kvtier_cache* cache, uint64_t tokens, uint64_t context,
                                     double seconds);
/* A split plan's front and load were both done `seconds` after the load began (ignored for a plan
 * that did not split). */
kvtier_status kvtier_observe_split(kvtier_cache* cache, const kvtier_prefill_plan* plan,
                                   double seconds);

/* Hybrid caches. Bytes of one state snapshot: per GDN layer, in the pattern's order, its f32
 * recurrent state [heads, d_k, d_v] then its conv window [conv_channels, conv_width - 1],
 * row-major. 0 for a plain cache. */
size_t kvtier_state_bytes(const kvtier_cache* cache);

/* Stores the snapshot taken after the prompt (n_tokens a multiple of the block size; `len` =
 * kvtier_state_bytes). *inserted (may be NULL) is 1 for a new snapshot, 0 for one already cached.
 * Nothing is stored on failure; KVTIER_FAILED_PRECONDITION on a plain cache. */
kvtier_status kvtier_store_state(kvtier_cache* cache, const kvtier_prompt* prompt, const void* snapshot,
                                 size_t len, int* inserted);

/* Copies the snapshot taken after the prompt into `dst` (`dst_len` = kvtier_state_bytes). *found is
 * 1 on a hit, 0 on a miss (dst unchanged). */
kvtier_status kvtier_fetch_state(kvtier_cache* cache, const kvtier_prompt* prompt, void* dst, size_t dst_len,
                                 int* found);

/* Every metric of the cache and its tiers as JSON ({"name": [{"labels": {...}, "value": v}]}).
 * *json is NUL-terminated; the caller frees it with kvtier_free. */
kvtier_status kvtier_stats_json(kvtier_cache* cache, char** json);

#ifdef __cplusplus
}
#endif

#endif /* KVTIER_H_ */
