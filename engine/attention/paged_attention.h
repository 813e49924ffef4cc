// The attention launchers over paged K/V.
//
// PagedAttentionDecode (kernels/attention/paged_attention_decode.comp): one query per sequence, one
// launch. Buffers: q, out f32 [num_seqs, num_heads, head_dim]; block_tables i32 [num_seqs,
// max_blocks_per_seq]; seq_lens i32 [num_seqs] (context length including the query's own token,
// whose K/V must already be in the cache). Contexts longer than one split are spread over several
// workgroups; the last of them to finish combines the splits, in split order (rows of more than 64
// splits: groups of 16 splits first, then the groups, each in order). A batch whose grid (sequences
// x KV heads x splits) exceeds the device's workgroup counts is refused, not truncated.
//
// PagedAttentionVarlen (kernels/attention/paged_attention_varlen.comp or _coopmat.comp [+ _merge]):
// prefill and decode in one launch. q, out f32 [total_rows, num_heads, head_dim], the rows of
// sequence i being [cu_seqlens_q[i], cu_seqlens_q[i+1]), the last q_len positions of its
// seq_lens[i]; causal. Host copies of cu_seqlens_q are needed to cut rows into tiles of one
// sequence each. Keys are split at fixed positions; a batch with few tiles (a short suffix after a
// restored prefix, a decode step) gives each split its own workgroup and merges after, with the
// same bits as one workgroup walking all splits. So a row's output depends only on its own tokens:
// not on how many rows share the launch, nor whether they are prefill or decode rows.
//
// Both: num_heads a multiple of the cache's num_kv_heads (GQA); options per AttentionOptions.
// Each launcher keeps scratch buffers that recorded batches use. Launches of any shapes may share
// one batch, and a launcher may go before batches it recorded into: every batch holds the scratch
// buffers and tile tables its launches use until it is done.
#pragma once

#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "base/log.h"
#include "engine/attention/kv_half_staging.h"
#include "engine/attention/paged_kv.h"
#include "engine/vulkan/command_batch.h"

namespace kvtier {

struct DecodeBatch {
  uint64_t q = 0;
  uint64_t out = 0;
  uint64_t block_tables = 0;
  uint32_t max_blocks_per_seq = 0;
  uint64_t seq_lens = 0;
  uint32_t num_seqs = 0;
  uint32_t max_seq_len = 0;  // at least the longest seq_lens entry (sizes the split grid)
  uint32_t num_heads = 0;
};

class PagedAttentionDecode {
 public:
  explicit PagedAttentionDecode(VulkanContext& ctx) : ctx_(ctx) {}
  Status record(CommandBatch& batch, const DecodeBatch& b, const PagedKvView& cache,
                const AttentionOptions& options);
  // Context tokens one workgroup covers for this cache's shape and this GQA ratio.
  uint32_t split_tokens(const PagedKvView& cache, uint32_t gqa) const;
  // The compiled decode pipeline's statistics for this shape (empty unless captured).
  std::string pipeline_statistics(const PagedKvView& cache, uint32_t gqa);

 private:
  struct Config {
    uint32_t wg, lanes, split, nv, subgroups, rs_steps, bf_steps, u;
  };
  Result<Config> configure(const PagedKvView& cache, uint32_t gqa) const;
  Result<std::shared_ptr<ComputePipeline>> decode_pipeline(const PagedKvView& cache, uint32_t gqa,
                                                           const Config& c);
  // Rows of more than kTwoLevelSplits splits merge in groups of kMergeGroup, then the groups (see
  // the kernel). Fixed: the tree's shape is part of a row's bits.
  static constexpr uint32_t kMergeGroup = 16;
  static constexpr uint32_t kTwoLevelSplits = 64;
  VulkanContext& ctx_;
  // Replaced by a larger one on demand; each batch holds the ones its launches use.
  std::shared_ptr<GpuBuffer> partial_;  // part_out then part_ml
  // u32 per (sequence, kv head), then per (sequence, kv head, group); zero between launches.
  std::shared_ptr<GpuBuffer> tickets_;
};

struct VarlenBatch {
  uint64_t q = 0;
  uint64_t out = 0;
  uint64_t block_tables = 0;
  uint32_t max_blocks_per_seq = 0;
  uint64_t seq_lens = 0;       // device i32 [num_seqs]
  uint64_t cu_seqlens_q = 0;   // device i32 [num_seqs + 1]
  std::span<const int32_t> host_cu_seqlens_q;  // the same, on the host
  uint32_t num_heads = 0;
  uint32_t max_seq_len = 0;    // at least the longest seq_lens entry (sizes the split grid)
  // `out` holds f16 rows (common/half_pack.glsl's rounding: the bits a to_half copy of the f32
  // rows gives), for a projection on tensor cores that reads f16. Only where writes_half().
  bool out_half = false;
};

class PagedAttentionVarlen {
 public:
  // How splits map to workgroups. kAuto picks by the batch's size; the others exist so tests can
  // check that the choice changes no bit.
  enum class SplitPolicy { kAuto, kWalkSplits, kWorkgroupPerSplit };
  // Which arithmetic: the scalar kernel (f32 FMAs, everywhere), the cooperative-matrix one
  // (tensor cores, f16 inputs, f32 accumulation; paged_attention_varlen_coopmat.comp) or the
  // cooperative-matrix-2 one (the same inputs on workgroup-scope tiles;
  // coopmat2/paged_attention_varlen_cm2.comp). Each has its own bits and keeps the parity
  // contract on its own, so a launcher settles on one from the device and the cache's shape alone
  // — never from a batch.
  enum class Path { kScalar, kCoopMat, kCoopMat2 };
  // The fastest path the device offers (cooperative matrices on the H100; cooperative matrices 2
  // only with KVTIER_VK_COOPMAT=2, while that kernel is the slower one).
  static Path default_path(const VulkanContext& ctx);
  // "scalar f32", "coopmat f16", "coopmat2 f16": for reports and logs.
  static const char* path_name(Path path);

  explicit PagedAttentionVarlen(VulkanContext& ctx, SplitPolicy policy = SplitPolicy::kAuto)
      : PagedAttentionVarlen(ctx, policy, default_path(ctx)) {}
  PagedAttentionVarlen(VulkanContext& ctx, SplitPolicy policy, Path preferred)
      : ctx_(ctx), policy_(policy), preferred_(preferred), staging_(ctx) {}
  // Prefill batches of a bf16 or f32 cache on the tensor-core path copy their context as f16
  // first (KvHalfStaging) unless this is off. The same bits either way; off exists so tests and
  // benchmarks can compare.
  void set_half_staging(bool on) { half_staging_ = on; }
  // Whether a batch of this shape stages its context as f16 (see record()).
  bool stages(const PagedKvView& cache, const VarlenBatch& b) const;
  // Prefills that would have staged but could not get the staging buffer (each logged, throttled)
  // and converted per chunk instead: the same bits, slower.
  uint64_t staging_fallbacks() const { return staging_fallbacks_; }
  Status record(CommandBatch& batch, const VarlenBatch& b, const PagedKvView& cache,
                const AttentionOptions& options);
  // The path this launcher takes for a cache of this shape and this many query heads: the
  // preferred one where the device and shape allow it, else the next one down (cooperative
  // matrix 2, then 1, then scalar).
  Path path(const PagedKvView& cache, uint32_t num_heads) const;
  // Whether a path writes f16 output rows (VarlenBatch::out_half): the cooperative-matrix one.
  static bool writes_half(Path path) { return path == Path::kCoopMat; }
  // Keys per split (fixed: a row's bits depend on it). A multiple of the kernels' key chunks.
  // Longer splits merge less, but give a split launch (a short suffix after a restored prefix)
  // fewer workgroups; 512 is where the two met on the H100 (docs/benchmarks.md, "512-key splits").
  static constexpr uint32_t kSplitTokens = 512;
  // The compiled pipeline's statistics for this shape (empty unless captured).
  std::string pipeline_statistics(const PagedKvView& cache, uint32_t num_heads);

 private:
  // Below this many (tile, KV head) workgroups a launch spreads splits over workgroups too.
  static constexpr uint32_t kMinWorkgroups = 256;
  static constexpr uint64_t kMaxPartialBytes = 256ull << 20;
  // Staging: every sequence at least this many tiles of rows (a chunk is then read that many
  // times), and at most this much memory.
  static constexpr uint32_t kStageMinTiles = 4;
  static constexpr uint64_t kMaxStagingBytes = 512ull << 20;
  // Rows (and keys per chunk) of the cooperative-matrix-2 kernel's tiles.
  static constexpr uint32_t kCoopMat2Rows = 64;

 private:
  struct Launch {
    Path path;
    uint32_t wg, qt;
    uint32_t lanes;       // scalar: lanes per row
    uint32_t row_blocks;  // cooperative matrices: 16-row blocks per tile
    uint32_t chunk;       // cooperative matrices: keys per K/V chunk in shared memory
  };
  // max_q_rows: the most query rows one sequence of the launch has (0: unknown, the widest tile).
  Result<Launch> configure(const PagedKvView& cache, uint32_t gqa, uint32_t max_q_rows = 0) const;
  static uint32_t longest_rows(const VarlenBatch& b);
  bool stages(const PagedKvView& cache, const VarlenBatch& b, const Launch& launch) const;
  // staged: `cache` is a KvHalfStaging copy, its block table the identity the kernel can compute.
  Result<std::shared_ptr<ComputePipeline>> varlen_pipeline(const PagedKvView& cache, uint32_t gqa,
                                                           const Launch& launch,
                                                           const AttentionOptions& o,
                                                           bool staged = false,
                                                           bool out_half = false);

  VulkanContext& ctx_;
  SplitPolicy policy_;
  Path preferred_;
  struct TilePool {
    std::mutex mu;
    std::vector<GpuBuffer> free;  // tables no batch holds any more
  };
  std::shared_ptr<TilePool> tile_pool_ = std::make_shared<TilePool>();
  std::shared_ptr<GpuBuffer> tiles_;  // holds tile_values_
  std::vector<int32_t> tile_values_;
  std::shared_ptr<GpuBuffer> partial_;  // per-split states of a split launch, as the decode's
  KvHalfStaging staging_;
  bool half_staging_ = true;
  uint64_t staging_fallbacks_ = 0;
  LogThrottle staging_log_;
};

}  // namespace kvtier
