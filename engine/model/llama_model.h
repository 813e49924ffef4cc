// LlamaModel: the small decoder of llama_weights.h on the GPU, reading and writing its KV through
// a GpuBlockPool's paged arrays. One forward() runs one step for many sequences: their new rows
// are embedded, pass every layer (RMSNorm, QKV, RoPE, reshape_and_cache into the rows' slots,
// paged attention over each sequence's block table, output projection, SwiGLU), and the wanted
// rows come back as logits. Every kernel computes a row independently, in a fixed order, so a
// row's logits do not depend on which other rows share the step — the property that lets a
// restored prefix reproduce a recomputed one bit for bit. Decode steps use the varlen attention
// kernel too (not the faster decode kernel, which sums in another order), so a generated token's
// K/V are the bits a prefill of the same text computes: a conversation's next turn may restore
// the previous answer's blocks and still match a recomputation exactly. Where the device has
// cooperative matrices, attention and the matmuls run on tensor cores (f16 inputs): other bits,
// the same properties.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "engine/attention/paged_attention.h"
#include "engine/attention/reshape_and_cache.h"
#include "engine/blocks/gpu_block_pool.h"
#include "engine/model/gated_delta.h"
#include "engine/model/gdn_state_pool.h"
#include "engine/model/llama_weights.h"
#include "engine/model/matmul.h"
#include "engine/model/rms_norm.h"
#include "engine/vulkan/gpu_timer.h"

namespace kvtier {

// Where one forward's time went: recording its launches on the host, then from submission until
// the host saw it done, of which the GPU's own clock measured gpu_seconds (when timing is on and
// the device has timestamps). The rest of submit_wait is the submission's and the wake-up's cost.
struct ForwardTiming {
  double setup_seconds = 0;   // from the call to recording: checks, metadata, pipelines
  double record_seconds = 0;  // recording, up to the last batch's submission
  double first_submit_seconds = 0;  // recording, up to the first batch's (the GPU idle until then)
  double submit_wait_seconds = 0;
  double readback_seconds = 0;  // from the wait's return: timestamps and logits read back
  std::optional<double> gpu_seconds;
  // With time_on_gpu(true, true): GPU seconds per kind of launch (summed over layers), in the
  // order they first run. A timestamp after every stage: for finding where a forward goes.
  std::vector<std::pair<std::string, double>> stages;
};

// One step. Rows of sequence i are [cu_seqlens_q[i], cu_seqlens_q[i+1]); seq_lens[i] counts its
// context after this step (the new rows are its last ones).
struct ForwardBatch {
  std::vector<int32_t> tokens;
  std::vector<int32_t> positions;
  std::vector<int32_t> slot_mapping;  // where each row's K/V goes: block * block_size + offset
  std::vector<int32_t> cu_seqlens_q;
  std::vector<int32_t> seq_lens;
  std::vector<int32_t> block_tables;  // [num_seqs, max_blocks_per_seq]
  int32_t max_blocks_per_seq = 0;
  std::vector<int32_t> logit_rows;    // rows whose logits are returned, in this order
  // Hybrid models: each sequence's slot in the GdnStatePool, whose states and windows its rows
  // continue from and leave (reset a slot for a fresh sequence; upload a snapshot to resume one).
  std::vector<int32_t> state_slots;
};

// Not thread-safe (scratch buffers); one per thread of work.
class LlamaModel {
 public:
  // Attention and the matmuls take `path` (default: the device's fastest) for the model's life: a
  // path has its own bits, so one model never mixes them. On kCoopMat, matrices whose shape the
  // tensor-core matmul takes (k % 32, n % 64) are kept in f16 instead and multiplied on it.
  static Result<std::unique_ptr<LlamaModel>> create(
      VulkanContext& ctx, LlamaConfig config, const LlamaWeights& weights,
      std::optional<PagedAttentionVarlen::Path> path = std::nullopt);
  const LlamaConfig& config() const { return config_; }
  // The attention path this model's KV shape takes.
  PagedAttentionVarlen::Path attention_path(DType kv_dtype, uint32_t block_size) const;

  // Logits [logit_rows.size(), vocab]. A hybrid model's GDN layers keep their state in `states`
  // (required for one, of its GDN layers' shape); `cache` holds the attention layers' KV.
  Result<std::vector<float>> forward(const ForwardBatch& batch, const GpuBlockPool& cache,
                                     GdnStatePool* states = nullptr);
  // The last forward's time, split (see ForwardTiming). With time_on_gpu, forwards also read
  // the GPU's clock (two timestamps per batch, or one per stage with by_stage): for benchmarks.
  const ForwardTiming& last_timing() const { return last_timing_; }
  Status time_on_gpu(bool on, bool by_stage = false);
  // RoPE and the KV-cache write as one launch (rope_cache.comp) where head_dim % 8 == 0: on by
  // default; the same bits either way, off so tests and benchmarks can compare.
  void set_fused_rope_cache(bool on) { fused_rope_cache_ = on; }
  // The first layer submitted on its own while the rest is recorded: on by default; the same
  // bits either way, off so tests can compare.
  void set_early_submit(bool on) { early_submit_ = on; }

 private:
  struct LayerWeights {
    GpuBuffer attn_norm, mlp_norm;
    MatmulWeights wq, wk, wv, wo, w_gate, w_up, w_down;
    MatmulWeights wqkv;  // wq, wk and wv side by side, in their stead on the tensor-load kernel
    MatmulWeights w_qkv, w_ab, w_out;  // GDN layers
    GpuBuffer conv_w, a_log, dt_bias;
  };
  LlamaModel(VulkanContext& ctx, PagedAttentionVarlen::Path path)
      : ctx_(ctx),
        tensor_cores_(path != PagedAttentionVarlen::Path::kScalar),
        half_inputs_(tensor_cores_ && ctx.info().coopmat2_tensor_loads),
        matmul_(ctx),
        reshape_(ctx),
        varlen_(ctx, PagedAttentionVarlen::SplitPolicy::kAuto, path),
        rule_(ctx),
        conv1d_(ctx) {}
  // Which rows of a forward the GDN layers take in the chunk form: each sequence's whole aligned
  // 16-token chunks (by position), the rows before and after them token by token. A token's form
  // thus depends on its position and on whether its aligned chunk came whole in one forward, so a
  // prompt split at multiples of 16 tokens (where snapshots are taken) gives the bits of one
  // forward, and decode steps (one row) stay token by token.
  struct GdnRows {
    uint64_t ranges = 0;  // i32 [sequences, 3] in the batch's metadata
    uint32_t max_before = 0, max_chunks = 0, max_after = 0;
  };
  static std::vector<int32_t> gdn_ranges(const ForwardBatch& b, GdnRows& rows);
  // Records GDN layer `gdn_index`'s token mixing: x += out_proj(rule(prepare(conv(qkv(hn))))).
  Status record_gdn(CommandBatch& cb, const LayerWeights& w, int gdn_index, uint32_t rows,
                    uint32_t max_q, uint64_t cu, uint64_t slots, GdnStatePool& states,
                    uint32_t sequences, const GdnRows& parts,
                    const std::function<void(const char*)>& stage);
  Status ensure_scratch(size_t rows, size_t logit_rows, size_t meta_ints);
  // A matmul's input: `rows`'s f32 values, and x16_ where the tensor-load kernel runs (the
  // producer, or record_half_copy, wrote them there).
  MatmulInput input(const GpuBuffer& rows) const {
    return {rows.address(), half_inputs_ ? x16_.address() : 0};
  }
  uint64_t half_rows() const { return half_inputs_ ? x16_.address() : 0; }
  uint64_t norm_rows() const { return norm_f32_ ? hn_.address() : 0; }
  // f16 copies of `count` values of `rows` into x16_ (and a barrier), where `w` reads them.
  Status record_half_copy(CommandBatch& cb, const MatmulWeights& w, const GpuBuffer& rows,
                          uint64_t count);

  VulkanContext& ctx_;
  bool tensor_cores_;  // matmuls on tensor cores where the device and shapes allow
                       // (MatmulWeights::upload)
  bool half_inputs_;   // ... on the tensor-load kernel (matmul_cm2), which reads f16 rows from x16_
  bool norm_f32_ = true;  // some matmul reads the norms' f32 rows (hn_); else they write only f16
  // SwiGLU's gate, up and silu_mul in one gated launch (Matmul::record_gated) writing act16_, for
  // a down projection that reads f16: no f32 gate_, up_, act_ rows.
  bool fused_mlp_ = false;
  // Attention writes f16 rows (VarlenBatch::out_half) into x16_ for the output projection: no f32
  // attn_ rows, no to_half pass.
  bool attn_half_ = false;
  bool fused_rope_cache_ = true;
  bool early_submit_ = true;
  LlamaConfig config_;
  GpuBuffer embedding_, final_norm_, rope_cos_, rope_sin_;
  MatmulWeights embedding_t_;
  Matmul matmul_;
  std::optional<RmsNorm> norm_;  // rows of hidden(), set by create()
  std::vector<LayerWeights> layers_;
  ReshapeAndCache reshape_;
  PagedAttentionVarlen varlen_;
  GatedDeltaRule rule_;
  CausalConv1d conv1d_;
  // Scratch, grown on demand.
  size_t rows_capacity_ = 0, logits_capacity_ = 0, meta_capacity_ = 0;
  GpuBuffer x_, hn_, q_, k_, v_, attn_, gate_, up_, act_, logits_, meta_, x16_, act16_;
  GpuBuffer qkv_, conv_, ab_, gq_, gk_, gv_, gg_, gbeta_, gout_, gchunks_;  // GDN layers
  GpuBuffer logits_host_;
  ForwardTiming last_timing_;
  std::unique_ptr<GpuTimer> timer_;  // with time_on_gpu(true)
  bool by_stage_ = false;
};

}  // namespace kvtier
