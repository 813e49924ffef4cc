/* The C ABI from C11: a block stored through kvtier.h comes back byte for byte from RAM and, after
 * close and reopen, from the SSD; misses, bad arguments and wrong sizes are status codes with a
 * message, and a refused store leaves nothing behind. Built with -std=c11 -pedantic -Werror. */
#define _POSIX_C_SOURCE 200809L
#include <kvtier.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;

#define CHECK(cond)                                                          \
  do {                                                                       \
    if (!(cond)) {                                                           \
      fprintf(stderr, "%s:%d: CHECK(%s) failed; last error: %s\n", __FILE__, \
              __LINE__, #cond, kvtier_last_error());                         \
      ++failures;                                                            \
    }                                                                        \
  } while (0)

#define REQUIRE_OK(call)                                                                        \
  do {                                                                                          \
    kvtier_status s_ = (call);                                                                  \
    if (s_ != KVTIER_OK) {                                                                      \
      fprintf(stderr, "%s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #call, kvtier_status_name(s_), \
              kvtier_last_error());                                                             \
      exit(1);                                                                                  \
    }                                                                                           \
  } while (0)

/* Every bit pattern a serializer might mangle, bf16 NaN payloads and subnormals included. */
static void fill(unsigned char* p, size_t n, unsigned seed) {
  unsigned x = seed * 2654435761u + 1u;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    p[i] = (unsigned char)(x >> 24);
  }
}

static kvtier_cache* open_cache(const char* dir) {
  kvtier_options* o = kvtier_options_create();
  kvtier_cache* c = NULL;
  CHECK(o != NULL);
  REQUIRE_OK(kvtier_options_set_layout(o, "tiny"));
  REQUIRE_OK(kvtier_options_set_namespace(o, "capi-test"));
  REQUIRE_OK(kvtier_options_set_ram_capacity(o, 16u << 20));
  REQUIRE_OK(kvtier_options_set_ssd_dir(o, dir));
  REQUIRE_OK(kvtier_options_set_ssd_capacity(o, 64u << 20));
  REQUIRE_OK(kvtier_options_set_ssd_segment_size(o, 8u << 20));
  REQUIRE_OK(kvtier_open(o, &c));
  kvtier_options_destroy(o);
  return c;
}

int main(void) {
  char dir[] = "/tmp/kvtier-capi-XXXXXX";
  uint32_t tokens[40];
  uint8_t hash0[KVTIER_HASH_BYTES], hash1[KVTIER_HASH_BYTES], missing[KVTIER_HASH_BYTES];
  kvtier_cached_block found_blocks[4];
  size_t n_blocks = 0, lost = 99, bytes, i;
  int inserted = -1, found = -1;
  unsigned char *block0, *block1, *out;
  char* json = NULL;
  kvtier_cache* c;
  char cmd[192];

  CHECK(kvtier_version() == KVTIER_VERSION);
  CHECK(mkdtemp(dir) != NULL);
  for (i = 0; i < 40; ++i) tokens[i] = (uint32_t)(1000 + i * 7);

  c = open_cache(dir);
  CHECK(kvtier_block_size(c) == 16);
  bytes = kvtier_block_bytes(c);
  CHECK(bytes == 16384); /* tiny: 2 layers x K,V x 16 tokens x 2 heads x 64 dims x 2 bytes */
  block0 = malloc(bytes);
  block1 = malloc(bytes);
  out = malloc(bytes);
  fill(block0, bytes, 1);
  fill(block1, bytes, 2);

  REQUIRE_OK(kvtier_store_block(c, &(kvtier_prompt){tokens, 16, NULL, 0}, NULL, block0, bytes, hash0, &inserted));
  CHECK(inserted == 1);
  REQUIRE_OK(kvtier_store_block(c, &(kvtier_prompt){tokens + 16, 16, NULL, 0}, hash0, block1, bytes, hash1, &inserted));
  CHECK(inserted == 1);
  REQUIRE_OK(kvtier_store_block(c, &(kvtier_prompt){tokens, 16, NULL, 0}, NULL, block0, bytes, NULL, &inserted));
  CHECK(inserted == 0);

  /* 40 tokens: two full blocks cached, the partial third never hashed. */
  REQUIRE_OK(kvtier_lookup(c, &(kvtier_prompt){tokens, 40, NULL, 0}, found_blocks, 4, &n_blocks));
  CHECK(n_blocks == 2);
  CHECK(memcmp(found_blocks[0].hash, hash0, KVTIER_HASH_BYTES) == 0);
  CHECK(memcmp(found_blocks[1].hash, hash1, KVTIER_HASH_BYTES) == 0);
  CHECK(found_blocks[1].tier == KVTIER_TIER_RAM);
  /* An extra key (a LoRA id) is another prefix. */
  {
    const char* lora[] = {"lora-7"};
    REQUIRE_OK(kvtier_lookup(c, &(kvtier_prompt){tokens, 40, lora, 1}, found_blocks, 4, &n_blocks));
    CHECK(n_blocks == 0);
  }

  REQUIRE_OK(kvtier_load_block(c, hash1, tokens + 16, 16, out, bytes, &found));
  CHECK(found == 1);
  CHECK(memcmp(out, block1, bytes) == 0);

  /* Part of the prefix: block 1 on (block 0 is the engine's to compute), into a buffer of two. */
  {
    unsigned char* two = malloc(2 * bytes);
    size_t loaded = 99;
    int late = -1;
    memset(two, 0x5a, 2 * bytes);
    REQUIRE_OK(kvtier_load_prefix(c, &(kvtier_prompt){tokens, 40, NULL, 0}, 1, 2, -1, two, 2 * bytes, &loaded, &late));
    CHECK(loaded == 1); /* only block 1 is cached after block 0 */
    CHECK(late == 0);
    CHECK(memcmp(two, block1, bytes) == 0);
    CHECK(two[bytes] == 0x5a && two[2 * bytes - 1] == 0x5a);
    /* From block 0, in memory: a timeout of 0 still loads (nothing waits on I/O). */
    REQUIRE_OK(kvtier_load_prefix(c, &(kvtier_prompt){tokens, 40, NULL, 0}, 0, 2, 0, two, 2 * bytes, &loaded, &late));
    CHECK(loaded == 2 && late == 0);
    CHECK(memcmp(two, block0, bytes) == 0 && memcmp(two + bytes, block1, bytes) == 0);
    CHECK(kvtier_load_prefix(c, &(kvtier_prompt){tokens, 40, NULL, 0}, 0, 2, -1, two, 2 * bytes - 1, &loaded, NULL) ==
          KVTIER_INVALID_ARGUMENT);
    CHECK(strstr(kvtier_last_error(), "do not fit") != NULL);
    free(two);
  }

  /* Hit plans: a pure load until the engine's prefill is known; the ends forced; a fast engine
   * computes. The prefix stops short of the last token: 40 tokens, 2 cached blocks. */
  {
    kvtier_prefill_plan plan;
    unsigned char* two = malloc(2 * bytes);
    size_t loaded = 0;
    const kvtier_prompt prompt = {tokens, 40, NULL, 0};
    REQUIRE_OK(kvtier_plan(c, &prompt, KVTIER_PLAN_COST, &plan));
    CHECK(plan.cached_blocks == 2 && plan.compute_blocks == 0);
    CHECK(plan.compute_only_seconds < 0); /* not known yet */
    REQUIRE_OK(kvtier_plan(c, &prompt, KVTIER_PLAN_COMPUTE, &plan));
    CHECK(plan.compute_blocks == 2 && plan.timeout_ms == -1);
    CHECK(kvtier_plan(c, &prompt, 7, &plan) == KVTIER_INVALID_ARGUMENT);
    CHECK(kvtier_plan(c, &prompt, KVTIER_PLAN_COST, NULL) == KVTIER_INVALID_ARGUMENT);
    CHECK(kvtier_observe_prefill(c, 0, 0, 0.1) == KVTIER_INVALID_ARGUMENT);
    CHECK(kvtier_observe_prefill(c, 16, 0, -1.0) == KVTIER_INVALID_ARGUMENT);
    for (int i = 0; i < 4; ++i) { /* pure loads: kvtier times them (the first only warms up) */
      REQUIRE_OK(kvtier_load_prefix(c, &prompt, 0, 2, -1, two, 2 * bytes, &loaded, NULL));
      CHECK(loaded == 2);
    }
    REQUIRE_OK(kvtier_observe_prefill(c, 64, 0, 64e-12));
    REQUIRE_OK(kvtier_observe_prefill(c, 256, 0, 256e-12));
    REQUIRE_OK(kvtier_observe_prefill(c, 1024, 0, 1024e-12));
    /* A load timed far under its estimate (loads of microseconds jitter) makes the next plan a
     * probe, which loads; the one after it plans from the estimates. */
    for (int i = 0; i < 3; ++i) {
      REQUIRE_OK(kvtier_plan(c, &prompt, KVTIER_PLAN_COST, &plan));
      if (!plan.probe) break;
    }
    CHECK(plan.probe == 0);
    CHECK(plan.compute_blocks == 2); /* faster than a memory copy: computing wins */
    CHECK(plan.compute_only_seconds >= 0 && plan.load_only_seconds > plan.compute_only_seconds);
    REQUIRE_OK(kvtier_observe_split(c, &plan, 0.01)); /* not a split: ignored */
    CHECK(kvtier_observe_split(c, &plan, 0.0) == KVTIER_INVALID_ARGUMENT);
    free(two);
  }

  /* A miss is not an error, and leaves the buffer alone. */
  memset(missing, 0xab, sizeof missing);
  memset(out, 0x5a, bytes);
  REQUIRE_OK(kvtier_load_block(c, missing, NULL, 0, out, bytes, &found));
  CHECK(found == 0);
  CHECK(out[0] == 0x5a && out[bytes - 1] == 0x5a);
  /* The right hash with other tokens is not served. */
  REQUIRE_OK(kvtier_load_block(c, hash1, tokens, 16, out, bytes, &found));
  CHECK(found == 0);

  /* Bad input: a status, a message, and nothing stored. */
  CHECK(kvtier_store_block(c, &(kvtier_prompt){tokens + 32, 16, NULL, 0}, hash1, block0, bytes - 2, NULL, NULL) ==
        KVTIER_INVALID_ARGUMENT);
  CHECK(strstr(kvtier_last_error(), "bytes") != NULL);
  CHECK(kvtier_store_block(c, &(kvtier_prompt){tokens + 32, 8, NULL, 0}, hash1, block0, bytes, NULL, NULL) ==
        KVTIER_INVALID_ARGUMENT);
  CHECK(strstr(kvtier_last_error(), "tokens") != NULL);
  CHECK(kvtier_store_block(c, &(kvtier_prompt){NULL, 16, NULL, 0}, NULL, block0, bytes, NULL, NULL) == KVTIER_INVALID_ARGUMENT);
  CHECK(kvtier_load_block(c, hash1, NULL, 0, out, bytes + 1, &found) == KVTIER_INVALID_ARGUMENT);
  CHECK(kvtier_lookup(NULL, &(kvtier_prompt){tokens, 40, NULL, 0}, NULL, 0, &n_blocks) == KVTIER_INVALID_ARGUMENT);
  CHECK(kvtier_lookup(c, NULL, NULL, 0, &n_blocks) == KVTIER_INVALID_ARGUMENT); /* no prompt */
  CHECK(kvtier_lookup(c, &(kvtier_prompt){tokens, 40, NULL, 1}, NULL, 0, &n_blocks) == KVTIER_INVALID_ARGUMENT);
  REQUIRE_OK(kvtier_lookup(c, &(kvtier_prompt){tokens, 40, NULL, 0}, NULL, 0, &n_blocks));
  CHECK(n_blocks == 2);
  CHECK(strcmp(kvtier_last_error(), "") == 0);

  REQUIRE_OK(kvtier_stats_json(c, &json));
  CHECK(json != NULL && strstr(json, "\"kvtier_embedded_rejected_calls_total\"") != NULL);
  CHECK(json != NULL && strstr(json, "\"kvtier_embedded_blocks_total\"") != NULL);
  kvtier_free(json);

  kvtier_close(c, &lost);
  CHECK(lost == 0);

  /* Reopened: the blocks come back from the SSD, byte for byte. */
  c = open_cache(dir);
  REQUIRE_OK(kvtier_lookup(c, &(kvtier_prompt){tokens, 40, NULL, 0}, found_blocks, 4, &n_blocks));
  CHECK(n_blocks == 2);
  CHECK(found_blocks[0].tier == KVTIER_TIER_SSD);
  REQUIRE_OK(kvtier_load_block(c, hash0, tokens, 16, out, bytes, &found));
  CHECK(found == 1);
  CHECK(memcmp(out, block0, bytes) == 0);
  REQUIRE_OK(kvtier_load_block(c, hash1, tokens + 16, 16, out, bytes, &found));
  CHECK(found == 1);
  CHECK(memcmp(out, block1, bytes) == 0);
  kvtier_close(c, NULL);

  /* A second open of a directory another cache holds is refused, with the reason. */
  {
    kvtier_cache* first = open_cache(dir);
    kvtier_options* o = kvtier_options_create();
    kvtier_cache* second = (kvtier_cache*)&o; /* must be reset to NULL on failure */
    REQUIRE_OK(kvtier_options_set_layout(o, "tiny"));
    REQUIRE_OK(kvtier_options_set_ssd_dir(o, dir));
    REQUIRE_OK(kvtier_options_set_ssd_capacity(o, 64u << 20));
    REQUIRE_OK(kvtier_options_set_ssd_segment_size(o, 8u << 20));
    REQUIRE_OK(kvtier_options_set_ram_capacity(o, 16u << 20));
    CHECK(kvtier_open(o, &second) != KVTIER_OK);
    CHECK(second == NULL);
    CHECK(strlen(kvtier_last_error()) > 0);
    kvtier_options_destroy(o);
    kvtier_close(first, NULL);
  }
  CHECK(kvtier_options_set_kv_cache_quantization(NULL, 8) == KVTIER_INVALID_ARGUMENT);
  /* Page-locking for a CUDA device at open: a negative ordinal is refused when set. */
  {
    kvtier_options* o = kvtier_options_create();
    CHECK(kvtier_options_set_cuda_device(o, -1) == KVTIER_INVALID_ARGUMENT);
    CHECK(strstr(kvtier_last_error(), "CUDA ordinal") != NULL);
    REQUIRE_OK(kvtier_options_set_cuda_device(o, 0));
    kvtier_options_destroy(o);
  }

  /* Two SSD directories (one per drive): a block stored in one run is read back in the next. */
  {
    char two[160];
    kvtier_options* o;
    int run;
    snprintf(two, sizeof two, "%s-nvme1", dir);
    for (run = 0; run < 2; ++run) {
      o = kvtier_options_create();
      REQUIRE_OK(kvtier_options_set_layout(o, "tiny"));
      REQUIRE_OK(kvtier_options_set_ssd_dir(o, dir));
      REQUIRE_OK(kvtier_options_add_ssd_dir(o, two));
      CHECK(kvtier_options_add_ssd_dir(o, NULL) == KVTIER_INVALID_ARGUMENT);
      REQUIRE_OK(kvtier_options_set_ssd_capacity(o, 64u << 20));
      REQUIRE_OK(kvtier_options_set_ssd_segment_size(o, 8u << 20));
      REQUIRE_OK(kvtier_open(o, &c));
      kvtier_options_destroy(o);
      if (run == 0) REQUIRE_OK(kvtier_store_block(c, &(kvtier_prompt){tokens, 16, NULL, 0}, NULL, block0, bytes, hash0, &inserted));
      REQUIRE_OK(kvtier_load_block(c, hash0, tokens, 16, out, bytes, &found));
      CHECK(found == 1);
      CHECK(memcmp(out, block0, bytes) == 0);
      kvtier_close(c, NULL);
    }
  }

  /* SSD admission and a write budget, as kvtierd's flags: the budget shows in the stats; an
   * unknown rule is refused at open, with the reason. */
  {
    kvtier_options* o = kvtier_options_create();
    char* stats = NULL;
    REQUIRE_OK(kvtier_options_set_layout(o, "tiny"));
    REQUIRE_OK(kvtier_options_set_ssd_dir(o, dir));
    REQUIRE_OK(kvtier_options_set_ssd_capacity(o, 64u << 20));
    REQUIRE_OK(kvtier_options_set_ssd_segment_size(o, 8u << 20));
    REQUIRE_OK(kvtier_options_set_ssd_admission(o, "seen-twice"));
    REQUIRE_OK(kvtier_options_set_ssd_write_budget(o, 3u << 30));
    CHECK(kvtier_options_set_ssd_admission(o, NULL) == KVTIER_INVALID_ARGUMENT);
    REQUIRE_OK(kvtier_open(o, &c));
    REQUIRE_OK(kvtier_stats_json(c, &stats));
    CHECK(strstr(stats, "kvtier_ssd_write_budget_bytes_per_day") != NULL);
    CHECK(strstr(stats, "3221225472") != NULL);
    kvtier_free(stats);
    kvtier_close(c, NULL);
    REQUIRE_OK(kvtier_options_set_ssd_admission(o, "sometimes"));
    c = (kvtier_cache*)&o;
    CHECK(kvtier_open(o, &c) == KVTIER_INVALID_ARGUMENT);
    CHECK(c == NULL);
    CHECK(strstr(kvtier_last_error(), "sometimes") != NULL);
    kvtier_options_destroy(o);
  }

  /* A hybrid cache: a state snapshot stored after two blocks comes back byte for byte, from RAM
   * and after a reopen from the SSD; lookups end at it; wrong sizes and plain caches are refused. */
  {
    static const char* hybrid =
        "{\"name\": \"c-hybrid\", \"block_size\": 16, \"dtype\": \"BF16\","
        " \"attention\": {\"num_kv_heads\": 2, \"head_dim\": 64},"
        " \"gdn\": {\"heads\": 2, \"d_k\": 16, \"d_v\": 16, \"conv_width\": 4, \"conv_channels\": 96},"
        " \"pattern\": [\"gdn\", \"attention\", \"gdn\"]}";
    char hdir[160];
    unsigned char *state, *back;
    size_t state_len, n_found;
    int run, present;
    kvtier_cached_block hb[4];
    snprintf(hdir, sizeof hdir, "%s-hybrid", dir);
    for (run = 0; run < 2; ++run) {
      kvtier_options* o = kvtier_options_create();
      REQUIRE_OK(kvtier_options_set_hybrid_layout(o, hybrid));
      REQUIRE_OK(kvtier_options_set_ssd_dir(o, hdir));
      REQUIRE_OK(kvtier_options_set_ssd_capacity(o, 64u << 20));
      REQUIRE_OK(kvtier_options_set_ssd_segment_size(o, 8u << 20));
      REQUIRE_OK(kvtier_open(o, &c));
      kvtier_options_destroy(o);
      state_len = kvtier_state_bytes(c);
      CHECK(state_len == 2 * (2 * 16 * 16 + 96 * 3) * 4);
      state = malloc(state_len);
      back = malloc(state_len);
      fill(state, state_len, 7);
      if (run == 0) {
        uint8_t h0[KVTIER_HASH_BYTES];
        uint8_t* blk = malloc(kvtier_block_bytes(c));
        fill(blk, kvtier_block_bytes(c), 8);
        REQUIRE_OK(kvtier_store_block(c, &(kvtier_prompt){tokens, 16, NULL, 0}, NULL, blk, kvtier_block_bytes(c), h0, &inserted));
        REQUIRE_OK(kvtier_store_block(c, &(kvtier_prompt){tokens + 16, 16, NULL, 0}, h0, blk, kvtier_block_bytes(c), NULL, &inserted));
        free(blk);
        REQUIRE_OK(kvtier_lookup(c, &(kvtier_prompt){tokens, 40, NULL, 0}, hb, 4, &n_found));
        CHECK(n_found == 0); /* no snapshot yet: nothing restorable */
        CHECK(kvtier_store_state(c, &(kvtier_prompt){tokens, 20, NULL, 0}, state, state_len, &inserted) == KVTIER_INVALID_ARGUMENT);
        CHECK(kvtier_store_state(c, &(kvtier_prompt){tokens, 32, NULL, 0}, state, state_len - 4, &inserted) == KVTIER_INVALID_ARGUMENT);
        REQUIRE_OK(kvtier_store_state(c, &(kvtier_prompt){tokens, 32, NULL, 0}, state, state_len, &inserted));
        CHECK(inserted == 1);
      }
      REQUIRE_OK(kvtier_lookup(c, &(kvtier_prompt){tokens, 40, NULL, 0}, hb, 4, &n_found));
      CHECK(n_found == 2);
      REQUIRE_OK(kvtier_fetch_state(c, &(kvtier_prompt){tokens, 32, NULL, 0}, back, state_len, &present));
      CHECK(present == 1);
      CHECK(memcmp(back, state, state_len) == 0);
      REQUIRE_OK(kvtier_fetch_state(c, &(kvtier_prompt){tokens, 16, NULL, 0}, back, state_len, &present));
      CHECK(present == 0);
      CHECK(kvtier_fetch_state(c, &(kvtier_prompt){tokens, 32, NULL, 0}, back, state_len + 1, &present) == KVTIER_INVALID_ARGUMENT);
      free(state);
      free(back);
      kvtier_close(c, NULL);
    }
    c = open_cache(dir);
    CHECK(kvtier_state_bytes(c) == 0);
    {
      unsigned char s8[8] = {0};
      CHECK(kvtier_store_state(c, &(kvtier_prompt){tokens, 32, NULL, 0}, s8, sizeof s8, &inserted) == KVTIER_FAILED_PRECONDITION);
    }
    kvtier_close(c, NULL);
    snprintf(cmd, sizeof cmd, "rm -rf %s", hdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", hdir);
  }

  free(block0);
  free(block1);
  free(out);
  snprintf(cmd, sizeof cmd, "rm -rf %s %s-nvme1", dir, dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  if (failures) fprintf(stderr, "%d checks failed\n", failures);
  return failures ? 1 : 0;
}
