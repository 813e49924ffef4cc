#include "engine/attention/paged_attention.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

namespace kvtier {

namespace {

struct DecodeParams {
  uint64_t q, out, k_cache, v_cache, block_tables, seq_lens, part_out, part_ml, tickets;
  uint32_t num_kv_heads, max_blocks_per_seq, max_splits;
  float scale, softcap;
  int32_t window;
};
struct VarlenParams {
  uint64_t q, out, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, tiles, partial;
  uint32_t num_kv_heads, max_blocks_per_seq;
  float scale, softcap;
  int32_t window;
  uint32_t max_splits;
};
struct VarlenMergeParams {
  uint64_t out, partial;
  uint32_t num_heads, max_splits;
};

uint32_t largest_pow2_dividing(uint32_t n, uint32_t cap) {
  uint32_t p = 1;
  while (p * 2 <= cap && n % (p * 2) == 0) p *= 2;
  return p;
}

Status check_shapes(uint32_t num_heads, const PagedKvView& cache) {
  if (cache.block_size == 0) return invalid_argument("attention: the cache's block_size is 0");
  if (cache.num_kv_heads == 0 || num_heads % cache.num_kv_heads != 0) {
    return invalid_argument("attention: num_heads " + std::to_string(num_heads) +
                            " is not a multiple of num_kv_heads " + std::to_string(cache.num_kv_heads));
  }
  if (cache.head_dim % 8 != 0 || cache.head_dim > 256) {
    return invalid_argument("attention: head_dim must be a multiple of 8, at most 256");
  }
  return ok_status();
}

}  // namespace

Result<PagedAttentionDecode::Config> PagedAttentionDecode::configure(const PagedKvView& cache,
                                                                     uint32_t gqa) const {
  // Callers check the shapes first (check_shapes): record() once per launch, not twice.
  const uint32_t elems = 16 / static_cast<uint32_t>(dtype_size(cache.dtype));
  const uint32_t vec_per_row = cache.head_dim / elems;
  const uint32_t subgroup = ctx_.info().subgroup_size;
  Config c;
  // Measured on an H100 (bf16, 32/8 heads, d128; unroll x workgroup x split swept): 128 threads
  // and 256-token splits gave the best bandwidth at every batch. Once the split's block addresses
  // sit in shared memory, 8 rows in flight per lane take 96 registers against 95 for 4, and read
  // faster at batch 8 and 64 (64 x 8k 0.91-0.92 of the copy kernel against 0.88-0.89; batch 1
  // unchanged). Double-buffering the rows instead took 126 registers and was slower everywhere.
  c.wg = std::max<uint32_t>(128, subgroup);
  c.u = 8;
  // A row's lanes share one subgroup (the reduce-scatter uses subgroupShuffleXor).
  c.lanes = largest_pow2_dividing(vec_per_row, std::min<uint32_t>(16, subgroup));
  c.nv = 1;
  while (c.nv < c.u * gqa) c.nv *= 2;
  c.subgroups = c.wg / subgroup;
  // The reduce-scatter halves the values held per lane until one is left or the lanes run out;
  // a plain butterfly finishes the rest.
  c.rs_steps = 0;
  for (uint32_t held = c.nv, lanes = c.lanes; held > 1 && lanes > 1; held /= 2, lanes /= 2) ++c.rs_steps;
  c.bf_steps = 0;
  for (uint32_t lanes = c.lanes >> c.rs_steps; lanes > 1; lanes /= 2) ++c.bf_steps;
  const uint32_t rows = c.wg / c.lanes;
  // The kernel's shared memory: scores (GQA per token of the split), the split's block offsets,
  // the rows' sums, per-subgroup statistics (maxima and sums) and one flag.
  auto shared_bytes = [&](uint64_t split) {
    return 4 * (gqa * split + uint64_t{rows} * cache.head_dim + 2 * uint64_t{c.subgroups} * gqa + 1) +
           8 * ((split + cache.block_size - 2) / cache.block_size + 1);
  };
  // Fixed per shape (never chosen from the batch) so a sequence's result never depends on what it
  // is batched with.
  uint32_t split = 256;
  while (split > 32 && shared_bytes(split) > ctx_.info().max_shared_memory) split /= 2;
  if (shared_bytes(split) > ctx_.info().max_shared_memory) {
    return unavailable("attention: shared memory too small for GQA " + std::to_string(gqa));
  }
  c.split = split;
  return c;
}

Result<std::shared_ptr<ComputePipeline>> PagedAttentionDecode::decode_pipeline(
    const PagedKvView& cache, uint32_t gqa, const Config& c) {
  return ctx_.pipeline("paged_attention_decode",
                       {c.wg, cache.head_dim, cache.block_size, gqa, c.lanes, c.split,
                        kernel_dtype(cache.dtype), c.nv, c.subgroups, c.rs_steps, c.bf_steps, c.u, kMergeGroup,
                        kTwoLevelSplits},
                       sizeof(DecodeParams));
}

std::string PagedAttentionDecode::pipeline_statistics(const PagedKvView& cache, uint32_t gqa) {
  if (Status st = check_shapes(gqa * cache.num_kv_heads, cache); !st.ok()) return st.to_string();
  auto c = configure(cache, gqa);
  if (!c.ok()) return c.status().to_string();
  auto p = decode_pipeline(cache, gqa, *c);
  return p.ok() ? (*p)->statistics() : p.status().to_string();
}

uint32_t PagedAttentionDecode::split_tokens(const PagedKvView& cache, uint32_t gqa) const {
  if (!check_shapes(gqa * cache.num_kv_heads, cache).ok()) return 0;
  auto c = configure(cache, gqa);
  return c.ok() ? c->split : 0;
}

Status PagedAttentionDecode::record(CommandBatch& batch, const DecodeBatch& b,
                                    const PagedKvView& cache, const AttentionOptions& o) {
  KVTIER_RETURN_IF_ERROR(check_shapes(b.num_heads, cache));
  if (b.num_seqs == 0) return ok_status();
  const uint32_t gqa = b.num_heads / cache.num_kv_heads;
  KVTIER_ASSIGN_OR_RETURN(Config c, configure(cache, gqa));
  const uint32_t max_splits = std::max<uint32_t>(1, (b.max_seq_len + c.split - 1) / c.split);
  const uint32_t* grid = ctx_.info().max_workgroup_count;
  if (max_splits > grid[0] || cache.num_kv_heads > grid[1] || b.num_seqs > grid[2]) {
    return invalid_argument("attention: decode of " + std::to_string(max_splits) + " splits of " +
                            std::to_string(c.split) + " tokens x " + std::to_string(cache.num_kv_heads) +
                            " KV heads x " + std::to_string(b.num_seqs) + " sequences exceeds the device's grid (" +
                            std::to_string(grid[0]) + " x " + std::to_string(grid[1]) + " x " +
                            std::to_string(grid[2]) + " workgroups)");
  }
  KVTIER_ASSIGN_OR_RETURN(auto decode, decode_pipeline(cache, gqa, c));
  uint64_t part_out = 0, part_ml = 0;
  if (max_splits > 1) {
    const uint64_t max_groups = (max_splits + kMergeGroup - 1) / kMergeGroup;
    const uint64_t ticket_bytes = std::max<uint64_t>(16, uint64_t{b.num_seqs} * cache.num_kv_heads * (1 + max_groups) * 4);
    if (!tickets_ || tickets_->size() < ticket_bytes) {
      // Zeroed once; every launch leaves them at zero (the last workgroup resets its ticket).
      // Launches recorded earlier keep the old buffers: their batches hold them (also below).
      KVTIER_ASSIGN_OR_RETURN(GpuBuffer grown, GpuBuffer::create(ctx_, ticket_bytes, MemoryKind::kDevice));
      tickets_ = std::make_shared<GpuBuffer>(std::move(grown));
      batch.fill(*tickets_, 0, ticket_bytes, 0);
      batch.barrier();
    }
    batch.retain(tickets_);
    const uint64_t rows = static_cast<uint64_t>(b.num_seqs) * b.num_heads * max_splits;
    const uint64_t need = rows * cache.head_dim * 4 + rows * 8;
    if (!partial_ || partial_->size() < need) {
      KVTIER_ASSIGN_OR_RETURN(GpuBuffer grown, GpuBuffer::create(ctx_, need, MemoryKind::kDevice));
      partial_ = std::make_shared<GpuBuffer>(std::move(grown));
    }
    batch.retain(partial_);
    part_out = partial_->address();
    part_ml = part_out + rows * cache.head_dim * 4;
  }
  DecodeParams p{b.q, b.out, cache.k, cache.v, b.block_tables, b.seq_lens, part_out, part_ml,
                 max_splits > 1 ? tickets_->address() : 0, cache.num_kv_heads, b.max_blocks_per_seq,
                 max_splits, o.scale, o.softcap, o.window};
  // Splits fastest (x): see the kernel's header.
  batch.dispatch(*decode, p, max_splits, cache.num_kv_heads, b.num_seqs);
  batch.barrier();
  return ok_status();
}

const char* PagedAttentionVarlen::path_name(Path path) {
  switch (path) {
    case Path::kScalar: return "scalar f32";
    case Path::kCoopMat: return "coopmat f16";
    case Path::kCoopMat2: return "coopmat2 f16";
  }
  return "unknown";
}

PagedAttentionVarlen::Path PagedAttentionVarlen::default_path(const VulkanContext& ctx) {
  if (ctx.info().prefer_coopmat2) return Path::kCoopMat2;
  return ctx.info().coopmat_mma_fragments ? Path::kCoopMat : Path::kScalar;
}

Result<PagedAttentionVarlen::Launch> PagedAttentionVarlen::configure(const PagedKvView& cache,
                                                                     uint32_t gqa,
                                                                     uint32_t max_q_rows) const {
  const DeviceInfo& info = ctx_.info();
  if (preferred_ == Path::kCoopMat2 && info.coopmat2 && cache.head_dim % 16 == 0 && cache.head_dim <= 128 &&
      kCoopMat2Rows % gqa == 0) {
    // Tiles of 64 rows (GQA heads x 64 / GQA tokens) against 64-key chunks: q is staged where the
    // K chunk goes, so the rows must fit in it. 256 invocations, no more than the driver allows
    // workgroup-scope matrices (the H100's: 256 — 512 ran faster there, and computed wrong rows).
    // Registers bound this kernel (H100, bf16, 4k / 16k tokens: 128 invocations 5.3 / 30.3
    // TFLOP/s, 256 8.6 / 39.1).
    const uint32_t wg = 256;
    const uint64_t shared = 2ull * kCoopMat2Rows * (cache.head_dim + 8) * 2 + info.coopmat2_reserved_shared;
    if (shared <= info.max_shared_memory && wg <= info.max_workgroup_invocations &&
        wg <= info.coopmat2_max_workgroup) {
      return Launch{Path::kCoopMat2, wg, kCoopMat2Rows / gqa, 0, 0, kCoopMat2Rows};
    }
  }
  if ((preferred_ == Path::kCoopMat || preferred_ == Path::kCoopMat2) && info.coopmat_mma_fragments &&
      cache.head_dim % 16 == 0) {
    // A subgroup per 16 rows of one query head, up to 8 subgroups sharing each K/V chunk (rows
    // of every query head of the KV head). Measured on the H100 (bf16, GQA 4, 4k/16k tokens, the
    // kernel before the softmax moved into registers): 8 subgroups 48/59 TFLOP/s, 4 subgroups
    // 26/31. Shared memory: K and V chunks (f16, the kernel's padded stride), where q is staged
    // too before the first chunk. Chunks of 64 keys where they fit (the kernel's first version:
    // 74 TFLOP/s at 16k against 70 for 32), else 32 (head_dim 256).
    // Heads of 64 dimensions hold half the registers of 128's, so a workgroup of 16 subgroups
    // (512 invocations) fits an SM and each K/V chunk serves twice the rows: 1B shape (32/8
    // heads, bf16, staged), 8192 / 32768 tokens: 139 / 150 -> 168 / 181 TFLOP/s on the H200.
    // 128-key chunks instead gained nothing there (163 / 174 with 8 subgroups). Tiles stay at
    // most 128 tokens long.
    const uint32_t wide = cache.head_dim <= 64 ? 16 : 8;
    auto shared_bytes = [&](uint32_t chunk) { return 2ull * chunk * (cache.head_dim + 8) * 2; };
    for (uint32_t chunk : {64u, 32u}) {
      for (uint32_t rb = std::clamp<uint32_t>(wide / gqa, 1, 8); rb >= 1; rb /= 2) {
        const uint32_t subgroups = rb * gqa;
        if (subgroups * 32 <= info.max_workgroup_invocations &&
            shared_bytes(chunk) <= info.max_shared_memory) {
          // A launch whose sequences are all shorter than a tile (a suffix after a restored
          // prefix) takes only the row blocks its rows need: the others would compute masked rows
          // on the same tensor cores, beside every chunk the real ones wait for. A row's bits do
          // not depend on its tile, so this is free to follow the batch. A GPU hit's 16 rows over
          // 8176 cached tokens (tiny, H200): the forward's GPU time 0.536 -> 0.490 ms. Narrower
          // tiles for long prompts lose: 1B shape, 8192 tokens 177 -> 134 TFLOP/s with 2 blocks
          // (2048 tokens: 94 -> 97 with 2, 100 with 1; docs/benchmarks.md).
          while (max_q_rows > 0 && rb > 1 && 16 * (rb / 2) >= max_q_rows) rb /= 2;
          return Launch{Path::kCoopMat, rb * gqa * 32, 16 * rb, 0, rb, chunk};
        }
        if (rb == 1) break;
      }
    }
  }
  // Each lane owns 32 dimensions (fewer lanes for small heads); a row's lanes share a subgroup.
  const uint32_t p = std::max<uint32_t>(1, cache.head_dim / 32);
  if (cache.head_dim % p != 0 || p > info.subgroup_size || (p & (p - 1)) != 0) {
    return unavailable("attention: head_dim " + std::to_string(cache.head_dim) +
                       " does not split over this device's subgroups");
  }
  uint32_t qt = 16;
  while (qt > 1 && qt * gqa * p > info.max_workgroup_invocations) qt /= 2;
  const uint32_t wg = qt * gqa * p;
  if (wg > info.max_workgroup_invocations || 2ull * 16 * cache.head_dim * 4 > info.max_shared_memory) {
    return unavailable("attention: GQA " + std::to_string(gqa) + " x head_dim " +
                       std::to_string(cache.head_dim) + " exceeds this device's workgroup limits");
  }
  return Launch{Path::kScalar, wg, qt, p, 0, 0};
}

PagedAttentionVarlen::Path PagedAttentionVarlen::path(const PagedKvView& cache, uint32_t num_heads) const {
  if (cache.num_kv_heads == 0 || num_heads % cache.num_kv_heads != 0) return Path::kScalar;
  auto c = configure(cache, num_heads / cache.num_kv_heads);
  return c.ok() ? c->path : Path::kScalar;
}

Result<std::shared_ptr<ComputePipeline>> PagedAttentionVarlen::varlen_pipeline(
    const PagedKvView& cache, uint32_t gqa, const Launch& l, const AttentionOptions& o, bool staged,
    bool out_half) {
  if (l.path == Path::kCoopMat2) {
    return ctx_.pipeline("paged_attention_varlen_cm2",
                         {l.wg, cache.head_dim, cache.block_size, gqa, l.qt, kernel_dtype(cache.dtype), kSplitTokens,
                          l.chunk},
                         sizeof(VarlenParams));
  }
  if (l.path == Path::kCoopMat) {
    // Without a softcap and with a positive scale, the kernel keeps raw dot products and folds the
    // scale into its exp2 (RAW_SCORES).
    const uint32_t raw_scores = o.softcap <= 0 && o.scale > 0 ? 1 : 0;
    // The next chunk's loads in flight during this one's products where they take one 16-byte
    // load of K and one of V per invocation (head_dim 64, 512 invocations): 1B shape, bf16
    // staged, 8192 / 32768 tokens 166 / 179 -> 178 / 187 TFLOP/s (H200, engine_bench, same call).
    // At head_dim 128 (four loads of each) they spilled registers and ran slower (see the kernel).
    // A narrower workgroup (a short suffix's, one row block per head) loads up to four of each at
    // head_dim 64: 32 registers more, where each of its threads may hold twice as many or more.
    const uint32_t epl = cache.dtype == DType::kF32 ? 4 : 8;
    const uint32_t loads = (l.chunk * (cache.head_dim / epl) + l.wg - 1) / l.wg;
    const uint32_t lookahead = loads == 1 || (loads <= 4 && cache.head_dim <= 64) ? 1 : 0;
    // Each row's sum of weights on the tensor cores at head_dim 64 and below, by the lanes above:
    // H200, bf16 staged, head_dim 64 at 32768 tokens 185.5 -> 188.1 TFLOP/s; head_dim 128 at
    // 4096 / 16384 tokens 175.2 / 185.5 -> 177.1 / 185.3, no gain worth new bits (see the kernel).
    const uint32_t sums_on_tensor_cores = cache.head_dim <= 64 ? 1 : 0;
    const char* kernel = ctx_.info().coopmat_khr ? "paged_attention_varlen_khr" : "paged_attention_varlen_coopmat";
    return ctx_.pipeline(kernel,
                         {l.wg, cache.head_dim, cache.block_size, gqa, l.row_blocks,
                          kernel_dtype(cache.dtype), kSplitTokens, l.chunk, raw_scores,
                          staged ? 1u : 0u, out_half ? 1u : 0u, lookahead, sums_on_tensor_cores},
                         sizeof(VarlenParams));
  }
  return ctx_.pipeline("paged_attention_varlen",
                       {l.wg, cache.head_dim, cache.block_size, gqa, l.qt, l.lanes, kernel_dtype(cache.dtype),
                        kSplitTokens},
                       sizeof(VarlenParams));
}

std::string PagedAttentionVarlen::pipeline_statistics(const PagedKvView& cache, uint32_t num_heads) {
  if (Status st = check_shapes(num_heads, cache); !st.ok()) return st.to_string();
  const uint32_t gqa = num_heads / cache.num_kv_heads;
  auto l = configure(cache, gqa);
  if (!l.ok()) return l.status().to_string();
  auto p = varlen_pipeline(cache, gqa, *l, AttentionOptions{});  // no softcap: the common variant
  return p.ok() ? (*p)->statistics() : p.status().to_string();
}

uint32_t PagedAttentionVarlen::longest_rows(const VarlenBatch& b) {
  int32_t most = 0;
  for (size_t s = 0; s + 1 < b.host_cu_seqlens_q.size(); ++s) {
    most = std::max(most, b.host_cu_seqlens_q[s + 1] - b.host_cu_seqlens_q[s]);
  }
  return static_cast<uint32_t>(most);
}

bool PagedAttentionVarlen::stages(const PagedKvView& cache, const VarlenBatch& b) const {
  if (!check_shapes(b.num_heads, cache).ok()) return false;
  const auto launch = configure(cache, b.num_heads / cache.num_kv_heads, longest_rows(b));
  return launch.ok() && stages(cache, b, *launch);
}

bool PagedAttentionVarlen::stages(const PagedKvView& cache, const VarlenBatch& b, const Launch& launch) const {
  // An f16 cache gains nothing by it: its chunk loads are plain copies already, and the block
  // addresses computed instead of read were worth -1 to +2 % (H100, 4k and 16k tokens, two calls).
  if (!half_staging_ || cache.dtype == DType::kF16 || launch.path != Path::kCoopMat ||
      b.host_cu_seqlens_q.size() < 2) {
    return false;
  }
  // A prefill: each sequence's chunks are read by at least kStageMinTiles tiles, so one copy
  // costs less than converting them on every read. Decode rows and a short suffix after a
  // restored prefix read their context about once: they convert in the kernel.
  for (size_t s = 0; s + 1 < b.host_cu_seqlens_q.size(); ++s) {
    if (b.host_cu_seqlens_q[s + 1] - b.host_cu_seqlens_q[s] < static_cast<int32_t>(kStageMinTiles * launch.qt)) {
      return false;
    }
  }
  const uint32_t num_seqs = static_cast<uint32_t>(b.host_cu_seqlens_q.size() - 1);
  return KvHalfStaging::bytes(cache, num_seqs, b.max_blocks_per_seq) <= kMaxStagingBytes;
}

Status PagedAttentionVarlen::record(CommandBatch& batch, const VarlenBatch& b,
                                    const PagedKvView& cache, const AttentionOptions& o) {
  KVTIER_RETURN_IF_ERROR(check_shapes(b.num_heads, cache));
  if (b.host_cu_seqlens_q.size() < 2) return ok_status();
  const uint32_t gqa = b.num_heads / cache.num_kv_heads;
  KVTIER_ASSIGN_OR_RETURN(const Launch launch, configure(cache, gqa, longest_rows(b)));
  if (b.out_half && !writes_half(launch.path)) {
    return invalid_argument(std::string("attention: f16 output rows on the ") +
                            path_name(launch.path) +
                            " path (only the cooperative-matrix path writes them)");
  }
  const uint32_t qt = launch.qt;
  // Tiles: up to qt consecutive rows of one sequence, a sequence's last rows first. Causal rows
  // further down see more keys: dispatched first, the longest tiles no longer finish alone at the
  // end of the launch while the other SMs idle (a row's bits do not depend on the order).
  std::vector<int32_t> tiles;
  for (size_t s = 0; s + 1 < b.host_cu_seqlens_q.size(); ++s) {
    const int32_t rows = b.host_cu_seqlens_q[s + 1] - b.host_cu_seqlens_q[s];
    if (rows <= 0) continue;
    for (int32_t r = (rows - 1) / static_cast<int32_t>(qt) * static_cast<int32_t>(qt); r >= 0;
         r -= static_cast<int32_t>(qt)) {
      tiles.push_back(static_cast<int32_t>(s));
      tiles.push_back(r);
    }
  }
  if (tiles.empty()) return ok_status();
  // A small host-visible table, never rewritten while a batch holds it: launches over the same
  // tiles (a model's layers, decode steps) share one; other tiles take another table, since
  // launches recorded before may not have run yet. A table goes back to the launcher's pool once
  // every batch holding it is done (or dropped): no barrier and, after the first few, no allocation.
  if (tiles != tile_values_) {
    GpuBuffer table;
    {
      std::lock_guard<std::mutex> lock(tile_pool_->mu);
      auto& free = tile_pool_->free;
      auto fits = std::find_if(free.begin(), free.end(), [&](const GpuBuffer& t) { return t.size() >= tiles.size() * 4; });
      if (fits != free.end()) {
        table = std::move(*fits);
        free.erase(fits);
      }
    }
    if (table.handle() == VK_NULL_HANDLE) {
      KVTIER_ASSIGN_OR_RETURN(table, GpuBuffer::create(ctx_, std::max<size_t>(4096, tiles.size() * 8),
                                                       MemoryKind::kUpload));
    }
    std::memcpy(table.mapped(), tiles.data(), tiles.size() * 4);
    KVTIER_RETURN_IF_ERROR(table.flush(0, tiles.size() * 4));
    tiles_ = std::shared_ptr<GpuBuffer>(new GpuBuffer(std::move(table)), [pool = tile_pool_](GpuBuffer* t) {
      {
        std::lock_guard<std::mutex> lock(pool->mu);
        pool->free.push_back(std::move(*t));
      }
      delete t;
    });
    tile_values_ = tiles;
  }
  batch.retain(tiles_);
  // A bf16 or f32 prefill on tensor cores reads an f16 copy of its context (same bits: the
  // conversion is the kernel's). H100, one prompt: see KvHalfStaging's kernel.
  PagedKvView kv = cache;
  uint64_t block_tables = b.block_tables;
  bool staged = stages(cache, b, launch);
  if (staged) {
    auto copy = staging_.record(batch, cache, b.block_tables, b.seq_lens,
                                static_cast<uint32_t>(b.host_cu_seqlens_q.size() - 1), b.max_blocks_per_seq);
    if (copy.ok()) {
      kv = copy->cache;
      block_tables = copy->block_tables;
    } else {
      // Staging only saves time: without its buffer (the device's memory full) the kernel
      // converts each chunk itself, to the same bits, rather than the prefill failing.
      staged = false;
      ++staging_fallbacks_;
      staging_log_.warn("attention: no f16 copy of the context ({}): converting per chunk instead",
                        copy.status().to_string());
    }
  }
  KVTIER_ASSIGN_OR_RETURN(auto pipeline, varlen_pipeline(kv, gqa, launch, o, staged, b.out_half));
  const uint32_t num_tiles = static_cast<uint32_t>(tiles.size() / 2);
  const uint32_t total_rows = static_cast<uint32_t>(b.host_cu_seqlens_q.back());
  const uint32_t max_splits = std::max<uint32_t>(1, (b.max_seq_len + kSplitTokens - 1) / kSplitTokens);
  const uint64_t partial_bytes = uint64_t{total_rows} * b.num_heads * max_splits * (cache.head_dim + 2) * 4;
  // The kernels tell a split launch by its grid (more than one split deep): with one split there
  // is nothing to spread, and walking it is the same computation.
  const bool split_launch =
      max_splits > 1 &&
      (policy_ == SplitPolicy::kWorkgroupPerSplit ||
       (policy_ == SplitPolicy::kAuto && num_tiles * cache.num_kv_heads < kMinWorkgroups &&
        partial_bytes <= kMaxPartialBytes));
  const uint32_t* grid = ctx_.info().max_workgroup_count;
  if (cache.num_kv_heads > grid[0] || num_tiles > grid[1] ||
      (split_launch && max_splits > grid[2])) {
    return invalid_argument("attention: varlen launch of " + std::to_string(num_tiles) + " tiles x " +
                            std::to_string(cache.num_kv_heads) + " KV heads x " +
                            std::to_string(split_launch ? max_splits : 1) + " splits exceeds the device's grid");
  }
  if (split_launch) {
    if (!partial_ || partial_->size() < partial_bytes) {
      const uint64_t bytes = std::max(partial_bytes, partial_ ? partial_->size() * 2 : 0);
      KVTIER_ASSIGN_OR_RETURN(GpuBuffer grown, GpuBuffer::create(ctx_, bytes, MemoryKind::kDevice));
      partial_ = std::make_shared<GpuBuffer>(std::move(grown));
    }
    batch.retain(partial_);
  }
  VarlenParams vp{b.q, b.out, kv.k, kv.v, block_tables, b.seq_lens, b.cu_seqlens_q,
                  tiles_->address(), split_launch ? partial_->address() : 0, cache.num_kv_heads,
                  b.max_blocks_per_seq, o.scale, o.softcap, o.window, max_splits};
  // KV heads fastest: the GPU starts workgroups in grid order (x fastest), so the tiles' longest
  // first order holds across heads only if a tile's heads come together. Tile by tile within a
  // head, a 2048-token prompt's 8 heads x 32 tiles started all of the first heads' short tiles
  // before the last heads' long ones, and those ran on alone at the end: list scheduling of that
  // order on 132 SMs takes 51 tile-chunks where longest-first takes 32 (the ideal).
  batch.dispatch(*pipeline, vp, cache.num_kv_heads, num_tiles, split_launch ? max_splits : 1);
  if (split_launch) {
    batch.barrier();
    KVTIER_ASSIGN_OR_RETURN(auto merge, ctx_.pipeline("paged_attention_varlen_merge",
                                                      {cache.head_dim, b.out_half ? 1u : 0u},
                                                      sizeof(VarlenMergeParams)));
    batch.dispatch(*merge, VarlenMergeParams{b.out, partial_->address(), b.num_heads, max_splits}, total_rows,
                   b.num_heads);
  }
  batch.barrier();
  return ok_status();
}

}  // namespace kvtier
