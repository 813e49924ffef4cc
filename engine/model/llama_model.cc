#include "engine/model/llama_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iterator>

#include "base/elapsed.h"

namespace kvtier {

namespace {

struct EmbeddingParams {
  uint64_t table, tokens, out;
  uint32_t num_tokens, dim, vocab, pad;
};
struct RopeParams {
  uint64_t q, k, positions, cos_table, sin_table;
  uint32_t rows, q_heads, k_heads, dim;
};
struct RopeCacheParams {
  uint64_t q, k, v, positions, cos_table, sin_table, k_cache, v_cache, slot_mapping;
  uint32_t rows, q_heads, k_heads, dim, cache_dtype, pad;
};
struct SiluMulParams {
  uint64_t gate, up, out, out16;
  uint32_t pairs, pad;
};
struct GdnPrepareParams {
  uint64_t conv, ab, a_log, dt_bias, q, k, v, g, beta;
  uint32_t rows, heads, d_k, d_v;
  float eps;
};

Result<GpuBuffer> upload_floats(VulkanContext& ctx, const std::vector<float>& v) {
  return upload_new<float>(ctx, std::span<const float>(v));
}

uint32_t groups(uint64_t n, uint32_t per) { return static_cast<uint32_t>((n + per - 1) / per); }

}  // namespace

PagedAttentionVarlen::Path LlamaModel::attention_path(DType kv_dtype, uint32_t block_size) const {
  const PagedKvView view{0, 0, 1, block_size, static_cast<uint32_t>(config_.num_kv_heads),
                         static_cast<uint32_t>(config_.head_dim), kv_dtype};
  return varlen_.path(view, static_cast<uint32_t>(config_.num_heads));
}

Result<std::unique_ptr<LlamaModel>> LlamaModel::create(VulkanContext& ctx, LlamaConfig config,
                                                       const LlamaWeights& w,
                                                       std::optional<PagedAttentionVarlen::Path> path) {
  // The matmul kernel works in vec4s along k and n.
  for (int dim : {config.hidden(), config.num_kv_heads * config.head_dim, config.ffn, config.vocab}) {
    if (dim <= 0 || dim % 4 != 0) return invalid_argument("llama model: every matrix dimension must be a multiple of 4");
  }
  if (!config.pattern.empty()) {
    const GdnSpec& g = config.gdn;
    if (static_cast<int>(config.pattern.size()) != config.num_layers) {
      return invalid_argument("hybrid model: the pattern must name every layer");
    }
    if (config.gdn_layers() > 0 &&
        (g.heads <= 0 || g.d_k <= 0 || g.d_v <= 0 || g.conv_channels != g.heads * (2 * g.d_k + g.d_v) ||
         g.conv_channels % 4 != 0 || (2 * g.heads) % 4 != 0 || (g.heads * g.d_v) % 4 != 0)) {
      return invalid_argument("hybrid model: GDN conv_channels must be heads * (2 d_k + d_v), and conv_channels, "
                              "2 heads and heads * d_v multiples of 4");
    }
  }
  std::unique_ptr<LlamaModel> m(new LlamaModel(ctx, path.value_or(PagedAttentionVarlen::default_path(ctx))));
  const uint32_t h = config.hidden(), kvd = config.num_kv_heads * config.head_dim;
  const uint32_t ffn = config.ffn, vocab = config.vocab;
  auto upload = [&](const std::vector<float>& values, uint32_t k, uint32_t n) {
    return MatmulWeights::upload(ctx, values, k, n, m->tensor_cores_);
  };
  m->config_ = config;
  KVTIER_ASSIGN_OR_RETURN(m->embedding_, upload_floats(ctx, w.embedding));
  KVTIER_ASSIGN_OR_RETURN(m->embedding_t_, upload(w.embedding_t, h, vocab));
  KVTIER_ASSIGN_OR_RETURN(m->final_norm_, upload_floats(ctx, w.final_norm));
  KVTIER_ASSIGN_OR_RETURN(m->rope_cos_, upload_floats(ctx, w.rope_cos));
  KVTIER_ASSIGN_OR_RETURN(m->rope_sin_, upload_floats(ctx, w.rope_sin));
  for (int layer = 0; layer < config.num_layers; ++layer) {
    const LlamaWeights::Layer& l = w.layers[layer];
    LayerWeights g;
    KVTIER_ASSIGN_OR_RETURN(g.attn_norm, upload_floats(ctx, l.attn_norm));
    if (config.is_gdn(layer)) {
      const GdnSpec& s = config.gdn;
      KVTIER_ASSIGN_OR_RETURN(g.w_qkv, upload(l.w_qkv, h, s.conv_channels));
      KVTIER_ASSIGN_OR_RETURN(g.w_ab, upload(l.w_ab, h, 2 * s.heads));
      KVTIER_ASSIGN_OR_RETURN(g.w_out, upload(l.w_out, s.heads * s.d_v, h));
      KVTIER_ASSIGN_OR_RETURN(g.conv_w, upload_floats(ctx, l.conv_w));
      KVTIER_ASSIGN_OR_RETURN(g.a_log, upload_floats(ctx, l.a_log));
      KVTIER_ASSIGN_OR_RETURN(g.dt_bias, upload_floats(ctx, l.dt_bias));
    } else {
      // On the tensor-load kernel q, k and v are one launch over their weights side by side.
      if (m->half_inputs_ && h % 32 == 0 && kvd % 32 == 0) {
        std::vector<float> joined(size_t{h} * (h + 2 * kvd));
        for (size_t i = 0; i < h; ++i) {
          float* row = joined.data() + i * (h + 2 * kvd);
          std::copy_n(l.wq.begin() + i * h, h, row);
          std::copy_n(l.wk.begin() + i * kvd, kvd, row + h);
          std::copy_n(l.wv.begin() + i * kvd, kvd, row + h + kvd);
        }
        KVTIER_ASSIGN_OR_RETURN(g.wqkv, upload(joined, h, h + 2 * kvd));
      }
      if (g.wqkv.kernel() != MatmulKernel::kTensorLoads) {
        g.wqkv = MatmulWeights{};
        KVTIER_ASSIGN_OR_RETURN(g.wq, upload(l.wq, h, h));
        KVTIER_ASSIGN_OR_RETURN(g.wk, upload(l.wk, h, kvd));
        KVTIER_ASSIGN_OR_RETURN(g.wv, upload(l.wv, h, kvd));
      }
      KVTIER_ASSIGN_OR_RETURN(g.wo, upload(l.wo, h, h));
    }
    KVTIER_ASSIGN_OR_RETURN(g.mlp_norm, upload_floats(ctx, l.mlp_norm));
    KVTIER_ASSIGN_OR_RETURN(g.w_gate, upload(l.w_gate, h, ffn));
    KVTIER_ASSIGN_OR_RETURN(g.w_up, upload(l.w_up, h, ffn));
    KVTIER_ASSIGN_OR_RETURN(g.w_down, upload(l.w_down, ffn, h));
    m->layers_.push_back(std::move(g));
  }
  // The norms write f32 rows only where a matmul reads them: on the tensor-load kernel every
  // projection of a plain Llama reads the f16 ones, and f32 rows nobody reads cost a write per
  // norm.
  auto reads_f32 = [](const MatmulWeights& w) { return w.k > 0 && !w.takes_half_input(); };
  m->norm_f32_ = !m->half_inputs_ || reads_f32(m->embedding_t_);
  KVTIER_ASSIGN_OR_RETURN(
      RmsNorm norm, RmsNorm::create(ctx, static_cast<uint32_t>(config.hidden()), config.rms_eps));
  m->norm_.emplace(std::move(norm));
  m->fused_mlp_ = m->half_inputs_;
  // Attention writes the output projection's f16 rows itself where its path can (else to_half
  // copies them from its f32 rows): decided once, not per layer and forward.
  // (A path depends on the heads' shape, not on the cache's dtype or block size.)
  m->attn_half_ =
      m->half_inputs_ && PagedAttentionVarlen::writes_half(m->attention_path(DType::kBF16, 16));
  for (const LayerWeights& g : m->layers_) {
    m->attn_half_ = m->attn_half_ && (g.wo.k == 0 || g.wo.takes_half_input());
    m->fused_mlp_ = m->fused_mlp_ && g.w_gate.kernel() == MatmulKernel::kTensorLoads &&
                    g.w_up.kernel() == MatmulKernel::kTensorLoads && g.w_down.takes_half_input();
    for (const MatmulWeights* w :
         {&g.wq, &g.wk, &g.wv, &g.wqkv, &g.w_gate, &g.w_up, &g.w_qkv, &g.w_ab}) {
      m->norm_f32_ = m->norm_f32_ || reads_f32(*w);
    }
  }
  return m;
}

Status LlamaModel::ensure_scratch(size_t rows, size_t logit_rows, size_t meta_ints) {
  const LlamaConfig& c = config_;
  if (rows > rows_capacity_) {
    const size_t n = std::max(rows, rows_capacity_ * 2);
    auto make = [&](GpuBuffer& b, size_t floats) -> Status {
      KVTIER_ASSIGN_OR_RETURN(b, GpuBuffer::create(ctx_, floats * 4, MemoryKind::kDevice));
      return ok_status();
    };
    const size_t h = c.hidden(), kvd = static_cast<size_t>(c.num_kv_heads) * c.head_dim;
    KVTIER_RETURN_IF_ERROR(make(x_, n * h));
    KVTIER_RETURN_IF_ERROR(make(hn_, n * h));
    KVTIER_RETURN_IF_ERROR(make(q_, n * h));
    KVTIER_RETURN_IF_ERROR(make(k_, n * kvd));
    KVTIER_RETURN_IF_ERROR(make(v_, n * kvd));
    if (!attn_half_) KVTIER_RETURN_IF_ERROR(make(attn_, n * h));
    if (fused_mlp_) {
      KVTIER_ASSIGN_OR_RETURN(act16_, GpuBuffer::create(ctx_, n * c.ffn * 2, MemoryKind::kDevice));
    } else {
      KVTIER_RETURN_IF_ERROR(make(gate_, n * c.ffn));
      KVTIER_RETURN_IF_ERROR(make(up_, n * c.ffn));
      KVTIER_RETURN_IF_ERROR(make(act_, n * c.ffn));
    }
    if (half_inputs_) {
      // f16 input rows of the tensor-load matmuls, one buffer for all (each is read before the
      // next is written): the widest of hidden, the GDN's output and, unless the gated launch
      // writes the down projection's rows to act16_, FFN.
      const size_t widest =
          std::max<size_t>({h, fused_mlp_ ? 0 : size_t(c.ffn), size_t(c.gdn.heads) * c.gdn.d_v});
      KVTIER_ASSIGN_OR_RETURN(x16_, GpuBuffer::create(ctx_, n * widest * 2, MemoryKind::kDevice));
    }
    if (c.gdn_layers() > 0) {
      const GdnSpec& g = c.gdn;
      const size_t qk = size_t(g.heads) * g.d_k, vd = size_t(g.heads) * g.d_v;
      KVTIER_RETURN_IF_ERROR(make(qkv_, n * g.conv_channels));
      KVTIER_RETURN_IF_ERROR(make(conv_, n * g.conv_channels));
      KVTIER_RETURN_IF_ERROR(make(ab_, n * 2 * g.heads));
      KVTIER_RETURN_IF_ERROR(make(gq_, n * qk));
      KVTIER_RETURN_IF_ERROR(make(gk_, n * qk));
      KVTIER_RETURN_IF_ERROR(make(gv_, n * vd));
      KVTIER_RETURN_IF_ERROR(make(gg_, n * g.heads));
      KVTIER_RETURN_IF_ERROR(make(gbeta_, n * g.heads));
      KVTIER_RETURN_IF_ERROR(make(gout_, n * vd));
      KVTIER_ASSIGN_OR_RETURN(
          gchunks_,
          GpuBuffer::create(ctx_, n * GatedDeltaRule::chunk_scratch_bytes(g.heads, g.d_k, g.d_v),
                            MemoryKind::kDevice));
    }
    rows_capacity_ = n;
  }
  if (logit_rows > logits_capacity_) {
    KVTIER_ASSIGN_OR_RETURN(logits_, GpuBuffer::create(ctx_, logit_rows * c.vocab * 4, MemoryKind::kDevice));
    KVTIER_ASSIGN_OR_RETURN(logits_host_, GpuBuffer::create(ctx_, logit_rows * c.vocab * 4, MemoryKind::kDownload));
    logits_capacity_ = logit_rows;
  }
  if (meta_ints > meta_capacity_) {
    const size_t n = std::max(meta_ints, meta_capacity_ * 2);
    KVTIER_ASSIGN_OR_RETURN(meta_, GpuBuffer::create(ctx_, n * 4, MemoryKind::kUpload));
    meta_capacity_ = n;
  }
  return ok_status();
}

namespace {
// Timestamps a by-stage forward may write: a start, and a dozen stages per layer.
constexpr uint32_t kStageMarks = 1024;
}  // namespace

Status LlamaModel::time_on_gpu(bool on, bool by_stage) {
  timer_.reset();
  by_stage_ = on && by_stage;
  if (!on) return ok_status();
  KVTIER_ASSIGN_OR_RETURN(timer_, GpuTimer::create(ctx_, by_stage ? kStageMarks : 2));
  return ok_status();
}

Status LlamaModel::record_half_copy(CommandBatch& cb, const MatmulWeights& w, const GpuBuffer& rows,
                                    uint64_t count) {
  if (!w.takes_half_input()) return ok_status();
  KVTIER_RETURN_IF_ERROR(matmul_.record_half_copy(cb, rows.address(), x16_.address(), count));
  cb.barrier();
  return ok_status();
}

std::vector<int32_t> LlamaModel::gdn_ranges(const ForwardBatch& b, GdnRows& rows) {
  constexpr int32_t kChunk = static_cast<int32_t>(GatedDeltaRule::kChunk);
  std::vector<int32_t> ranges;
  for (size_t s = 0; s + 1 < b.cu_seqlens_q.size(); ++s) {
    const int32_t n = b.cu_seqlens_q[s + 1] - b.cu_seqlens_q[s];
    const int32_t first = n > 0 ? b.positions[b.cu_seqlens_q[s]] : 0;
    const int32_t before = std::min(n, (kChunk - first % kChunk) % kChunk);
    const int32_t chunks = (n - before) / kChunk * kChunk;
    ranges.insert(ranges.end(), {before, chunks, n - before - chunks});
    rows.max_before = std::max<uint32_t>(rows.max_before, before);
    rows.max_chunks = std::max<uint32_t>(rows.max_chunks, chunks / kChunk);
    rows.max_after = std::max<uint32_t>(rows.max_after, n - before - chunks);
  }
  return ranges;
}

Status LlamaModel::record_gdn(CommandBatch& cb, const LayerWeights& w, int gdn_index, uint32_t rows,
                              uint32_t max_q, uint64_t cu, uint64_t slots, GdnStatePool& states,
                              uint32_t sequences, const GdnRows& parts,
                              const std::function<void(const char*)>& stage) {
  const GdnSpec& g = config_.gdn;
  KVTIER_ASSIGN_OR_RETURN(auto p_prepare, ctx_.pipeline("gdn_prepare", {}, sizeof(GdnPrepareParams)));
  KVTIER_RETURN_IF_ERROR(matmul_.record(cb, input(hn_), w.w_qkv, qkv_.address(), rows, false));
  KVTIER_RETURN_IF_ERROR(matmul_.record(cb, input(hn_), w.w_ab, ab_.address(), rows, false));
  cb.barrier();
  stage("gdn: qkv, a/b matmuls");
  const CausalConvBatch conv{qkv_.address(), w.conv_w.address(), 0, states.window_address(gdn_index), conv_.address(),
                             cu, slots, sequences, static_cast<uint32_t>(g.conv_channels),
                             static_cast<uint32_t>(g.conv_width), max_q};
  KVTIER_RETURN_IF_ERROR(conv1d_.record(cb, conv));
  cb.barrier();
  stage("gdn: conv1d");
  const uint32_t heads = static_cast<uint32_t>(g.heads);
  cb.dispatch(*p_prepare,
              GdnPrepareParams{conv_.address(), ab_.address(), w.a_log.address(), w.dt_bias.address(), gq_.address(),
                               gk_.address(), gv_.address(), gg_.address(), gbeta_.address(), rows, heads,
                               static_cast<uint32_t>(g.d_k), static_cast<uint32_t>(g.d_v), 1e-6f},
              groups(static_cast<uint64_t>(rows) * heads, 64));
  cb.barrier();
  stage("gdn: prepare");
  GatedDeltaBatch rule{gq_.address(),
                       gk_.address(),
                       gv_.address(),
                       gg_.address(),
                       gbeta_.address(),
                       gout_.address(),
                       states.state_address(gdn_index),
                       cu,
                       slots,
                       sequences,
                       heads,
                       static_cast<uint32_t>(g.d_k),
                       static_cast<uint32_t>(g.d_v),
                       max_q,
                       1.0f / std::sqrt(static_cast<float>(g.d_k))};
  if (parts.max_chunks > 0) {
    rule.ranges = parts.ranges;
    rule.max_before = parts.max_before, rule.max_chunks = parts.max_chunks,
    rule.max_after = parts.max_after;
    rule.chunk_scratch = gchunks_.address();
    KVTIER_RETURN_IF_ERROR(rule_.record_all_parts(cb, rule));
  } else {
    KVTIER_RETURN_IF_ERROR(rule_.record(cb, rule));
  }
  cb.barrier();
  stage("gdn: delta rule");
  KVTIER_RETURN_IF_ERROR(
      record_half_copy(cb, w.w_out, gout_, static_cast<uint64_t>(rows) * g.heads * g.d_v));
  KVTIER_RETURN_IF_ERROR(matmul_.record(cb, input(gout_), w.w_out, x_.address(), rows, true));
  cb.barrier();
  return ok_status();
}

Result<std::vector<float>> LlamaModel::forward(const ForwardBatch& b, const GpuBlockPool& cache, GdnStatePool* states) {
  const auto entered = std::chrono::steady_clock::now();
  const LlamaConfig& c = config_;
  const size_t rows = b.tokens.size();
  const size_t num_seqs = b.seq_lens.size();
  if (rows == 0 || b.positions.size() != rows || b.slot_mapping.size() != rows ||
      b.cu_seqlens_q.size() != num_seqs + 1 || b.cu_seqlens_q.back() != static_cast<int32_t>(rows) ||
      b.block_tables.size() != num_seqs * static_cast<size_t>(b.max_blocks_per_seq)) {
    return invalid_argument("forward: inconsistent batch shapes");
  }
  for (int32_t t : b.tokens) {
    if (t < 0 || t >= c.vocab) return invalid_argument("forward: token " + std::to_string(t) + " out of vocabulary");
  }
  for (int32_t p : b.positions) {
    if (p < 0 || p >= c.max_positions) return invalid_argument("forward: position out of range");
  }
  if (c.gdn_layers() > 0) {
    if (!states || states->gdn_layers() != c.gdn_layers() || !(states->spec() == c.gdn)) {
      return invalid_argument("forward: a hybrid model needs a GDN state pool of its shape");
    }
    if (b.state_slots.size() != num_seqs) return invalid_argument("forward: one state slot per sequence");
    for (int32_t s : b.state_slots) {
      if (s < 0 || static_cast<uint32_t>(s) >= states->slots()) return invalid_argument("forward: state slot out of range");
    }
  }
  if (cache.layout().num_layers != c.attention_layers() || cache.layout().num_kv_heads != c.num_kv_heads ||
      cache.layout().head_dim != c.head_dim) {
    return invalid_argument("forward: the cache's layout is not this model's");
  }
  const size_t nlog = b.logit_rows.size();
  for (int32_t row : b.logit_rows) {
    if (row < 0 || static_cast<size_t>(row) >= rows)
      return invalid_argument("forward: logit row out of range");
  }
  // Batch metadata, one host-visible buffer: tokens | positions | slots | cu | seq_lens | tables |
  // state slots | logit rows | the GDN's ranges, each copied straight into it. Before the first
  // launch is recorded the GPU waits, and a 32k-token prompt's metadata is 400 KB: gathered in a
  // growing vector first, it took an allocation per doubling and a second copy (H200, tiny model,
  // 32768 tokens, three rounds in turns: the host's setup 0.196-0.213 -> 0.113-0.124 ms).
  GdnRows gdn_rows;
  std::vector<int32_t> ranges;
  if (c.gdn_layers() > 0 && GatedDeltaRule::chunk_form_takes(static_cast<uint32_t>(c.gdn.d_k))) {
    ranges = gdn_ranges(b, gdn_rows);
  }
  const std::vector<int32_t>* parts[] = {&b.tokens,       &b.positions,  &b.slot_mapping,
                                         &b.cu_seqlens_q, &b.seq_lens,   &b.block_tables,
                                         &b.state_slots,  &b.logit_rows, &ranges};
  size_t offset[std::size(parts)];
  size_t meta_ints = 0;
  for (size_t i = 0; i < std::size(parts); ++i) {
    offset[i] = meta_ints;
    meta_ints += parts[i]->size();
  }
  KVTIER_RETURN_IF_ERROR(
      ensure_scratch(std::max(rows, nlog), std::max<size_t>(nlog, 1), meta_ints + 4));
  for (size_t i = 0; i < std::size(parts); ++i) {
    if (!parts[i]->empty())
      std::memcpy(meta_.mapped() + offset[i] * 4, parts[i]->data(), parts[i]->size() * 4);
  }
  KVTIER_RETURN_IF_ERROR(meta_.flush(0, meta_ints * 4));
  const size_t o_tokens = offset[0], o_pos = offset[1], o_slots = offset[2], o_cu = offset[3],
               o_lens = offset[4], o_tables = offset[5], o_state_slots = offset[6],
               o_logit_rows = offset[7];
  gdn_rows.ranges = offset[8];  // an offset until the buffer's address is known
  auto at = [&](size_t ints) { return meta_.address() + ints * 4; };
  gdn_rows.ranges = at(gdn_rows.ranges);

  const uint32_t h = c.hidden(), r32 = static_cast<uint32_t>(rows);
  const uint32_t embed_vec = h % 4 == 0 ? 4 : 1;
  KVTIER_ASSIGN_OR_RETURN(auto p_embed,
                          ctx_.pipeline("embedding", {embed_vec}, sizeof(EmbeddingParams)));
  auto norm = [&](CommandBatch& batch, const GpuBuffer& weight, uint64_t rows_list, uint32_t n) {
    norm_->record(
        batch, RmsNormRows{x_.address(), weight.address(), norm_rows(), half_rows(), rows_list, n});
  };
  const uint32_t rope_vec = c.head_dim % 8 == 0 ? 4 : 1;  // pairs per invocation (rope.comp)
  KVTIER_ASSIGN_OR_RETURN(auto p_rope, ctx_.pipeline("rope", {rope_vec}, sizeof(RopeParams)));
  KVTIER_ASSIGN_OR_RETURN(auto p_silu, ctx_.pipeline("silu_mul", {}, sizeof(SiluMulParams)));
  // RoPE and the cache write in one launch where its 4-pair units fit the heads (same bits; a
  // hit's short forward pays per launch: tiny, 16 rows over 8176 cached tokens, H200, 0.490 ->
  // 0.470 ms of GPU time); rope, then reshape_and_cache, otherwise.
  std::shared_ptr<ComputePipeline> p_rope_cache;
  if (c.head_dim % 8 == 0 && fused_rope_cache_) {
    KVTIER_ASSIGN_OR_RETURN(p_rope_cache, ctx_.pipeline("rope_cache", {}, sizeof(RopeCacheParams)));
  }
  const auto record_started = std::chrono::steady_clock::now();
  KVTIER_ASSIGN_OR_RETURN(CommandBatch first, CommandBatch::begin(ctx_));
  // The first layer goes to the GPU while the host records the rest: recording a forward took
  // 0.22-0.48 ms of the 1B's 2048-token prefill, time the GPU otherwise waited (H200, one call,
  // two rounds in turns: wall 20.1 / 20.0 -> 19.8 / 19.8 ms; a tiny GPU hit's 16-row forward
  // 0.61 / 0.68 -> 0.59 / 0.58). A barrier ends each batch, and batches on one queue run in
  // order, so the bits are the same.
  std::optional<CommandBatch> rest;
  CommandBatch* cb = &first;
  std::optional<std::chrono::steady_clock::time_point> first_submitted;
  if (timer_) timer_->start(*cb);
  // By stage: a timestamp after each kind of launch (its barrier recorded), named.
  std::vector<const char*> stage_names;
  auto stage = [&](const char* name) {
    if (!by_stage_ || stage_names.size() + 2 >= kStageMarks) return;
    stage_names.push_back(name);
    timer_->mark(*cb, static_cast<uint32_t>(stage_names.size()));
  };
  cb->dispatch(*p_embed,
               EmbeddingParams{embedding_.address(), at(o_tokens), x_.address(), r32, h,
                               static_cast<uint32_t>(c.vocab), 0},
               groups(static_cast<uint64_t>(rows) * h / embed_vec, 256));
  cb->barrier();
  stage("embedding");

  uint32_t max_len = 0;
  uint32_t max_q = 0;  // the most rows one sequence has in this step
  for (size_t s = 0; s < num_seqs; ++s) {
    max_len = std::max<uint32_t>(max_len, b.seq_lens[s]);
    max_q = std::max<uint32_t>(max_q, b.cu_seqlens_q[s + 1] - b.cu_seqlens_q[s]);
  }
  int attention_index = 0, gdn_index = 0;
  const AttentionOptions attn_opts{1.0f / std::sqrt(static_cast<float>(c.head_dim)), 0.0f, 0};
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& w = layers_[l];
    norm(*cb, w.attn_norm, 0, r32);
    cb->barrier();
    stage("rms_norm");
    if (c.is_gdn(l)) {
      KVTIER_RETURN_IF_ERROR(record_gdn(*cb, w, gdn_index++, r32, max_q, at(o_cu),
                                        at(o_state_slots), *states, static_cast<uint32_t>(num_seqs),
                                        gdn_rows, stage));
      stage("gdn: output matmul");
    } else {
      if (w.wqkv.k > 0) {
        const uint32_t kvd = static_cast<uint32_t>(c.num_kv_heads * c.head_dim);
        const MatmulSegment qkv[] = {{q_.address(), h}, {k_.address(), kvd}, {v_.address(), kvd}};
        KVTIER_RETURN_IF_ERROR(matmul_.record_segments(*cb, input(hn_), w.wqkv, qkv, r32));
      } else {
        KVTIER_RETURN_IF_ERROR(matmul_.record(*cb, input(hn_), w.wq, q_.address(), r32, false));
        KVTIER_RETURN_IF_ERROR(matmul_.record(*cb, input(hn_), w.wk, k_.address(), r32, false));
        KVTIER_RETURN_IF_ERROR(matmul_.record(*cb, input(hn_), w.wv, v_.address(), r32, false));
      }
      cb->barrier();
      stage("qkv matmuls");
      const PagedKvView& kv = cache.layer(attention_index++);
      if (p_rope_cache) {
        cb->dispatch(*p_rope_cache,
                     RopeCacheParams{q_.address(), k_.address(), v_.address(), at(o_pos),
                                     rope_cos_.address(), rope_sin_.address(), kv.k, kv.v,
                                     at(o_slots), r32, static_cast<uint32_t>(c.num_heads),
                                     static_cast<uint32_t>(c.num_kv_heads),
                                     static_cast<uint32_t>(c.head_dim), kernel_dtype(kv.dtype), 0},
                     groups(static_cast<uint64_t>(rows) * (c.num_heads + 2 * c.num_kv_heads) *
                                c.head_dim / 8,
                            256));
        cb->barrier();
        stage("rope + cache write");
      } else {
        cb->dispatch(
            *p_rope,
            RopeParams{q_.address(), k_.address(), at(o_pos), rope_cos_.address(),
                       rope_sin_.address(), r32, static_cast<uint32_t>(c.num_heads),
                       static_cast<uint32_t>(c.num_kv_heads), static_cast<uint32_t>(c.head_dim)},
            groups(static_cast<uint64_t>(rows) * (c.num_heads + c.num_kv_heads) * c.head_dim / 2 /
                       rope_vec,
                   256));
        cb->barrier();
        stage("rope");
        KVTIER_RETURN_IF_ERROR(
            reshape_.record(*cb, k_.address(), v_.address(), DType::kF32, at(o_slots), r32, kv));
      }
      VarlenBatch vb{q_.address(),   attn_half_ ? x16_.address() : attn_.address(),
                     at(o_tables),   static_cast<uint32_t>(b.max_blocks_per_seq),
                     at(o_lens),     at(o_cu),
                     b.cu_seqlens_q, static_cast<uint32_t>(c.num_heads),
                     max_len,        attn_half_};
      KVTIER_RETURN_IF_ERROR(varlen_.record(*cb, vb, kv, attn_opts));
      stage(p_rope_cache ? "attention" : "reshape_and_cache + attention");
      if (!attn_half_)
        KVTIER_RETURN_IF_ERROR(record_half_copy(*cb, w.wo, attn_, static_cast<uint64_t>(rows) * h));
      KVTIER_RETURN_IF_ERROR(matmul_.record(*cb, input(attn_), w.wo, x_.address(), r32, true));
      cb->barrier();
      stage("output matmul");
    }
    norm(*cb, w.mlp_norm, 0, r32);
    cb->barrier();
    stage("rms_norm");
    if (fused_mlp_) {
      KVTIER_RETURN_IF_ERROR(
          matmul_.record_gated(*cb, input(hn_), w.w_gate, w.w_up, act16_.address(), r32));
      cb->barrier();
      stage("gate/up matmuls + silu_mul");
      KVTIER_RETURN_IF_ERROR(
          matmul_.record(*cb, MatmulInput{0, act16_.address()}, w.w_down, x_.address(), r32, true));
    } else {
      KVTIER_RETURN_IF_ERROR(
          matmul_.record(*cb, input(hn_), w.w_gate, gate_.address(), r32, false));
      KVTIER_RETURN_IF_ERROR(matmul_.record(*cb, input(hn_), w.w_up, up_.address(), r32, false));
      cb->barrier();
      stage("gate/up matmuls");
      // The down projection reads one of the two: f16 rows on the tensor-load kernel, else f32.
      const bool down_half = w.w_down.takes_half_input();
      cb->dispatch(
          *p_silu,
          SiluMulParams{gate_.address(), up_.address(), down_half ? 0 : act_.address(),
                        down_half ? x16_.address() : 0, static_cast<uint32_t>(rows * c.ffn / 2), 0},
          groups(static_cast<uint64_t>(rows) * c.ffn / 2, 256));
      cb->barrier();
      stage("silu_mul");
      KVTIER_RETURN_IF_ERROR(matmul_.record(*cb, input(act_), w.w_down, x_.address(), r32, true));
    }
    cb->barrier();
    stage("down matmul");
    if (l == 0 && c.num_layers > 1 && early_submit_) {
      KVTIER_RETURN_IF_ERROR(first.submit().status());
      first_submitted = std::chrono::steady_clock::now();
      KVTIER_ASSIGN_OR_RETURN(CommandBatch next, CommandBatch::begin(ctx_));
      cb = &rest.emplace(std::move(next));
    }
  }
  // Only the rows whose logits are read, normed into the first nlog rows of hn_ / x16_, then
  // one launch for all of them (a row's bits do not depend on the rows beside it): the norm of
  // every row and a launch per logit row did work no one read.
  if (nlog > 0) {
    norm(*cb, final_norm_, at(o_logit_rows), static_cast<uint32_t>(nlog));
    cb->barrier();
    KVTIER_RETURN_IF_ERROR(matmul_.record(*cb, input(hn_), embedding_t_, logits_.address(),
                                          static_cast<uint32_t>(nlog), false));
    cb->barrier();
    cb->copy(logits_, 0, logits_host_, 0, nlog * c.vocab * 4ull);
  }
  stage("final norm + logits");
  if (timer_ && !by_stage_) timer_->stop(*cb);
  const auto submitted = std::chrono::steady_clock::now();
  KVTIER_RETURN_IF_ERROR(cb->submit_and_wait());
  const auto waited = std::chrono::steady_clock::now();
  last_timing_.setup_seconds = std::chrono::duration<double>(record_started - entered).count();
  last_timing_.record_seconds = std::chrono::duration<double>(submitted - record_started).count();
  last_timing_.submit_wait_seconds = std::chrono::duration<double>(waited - submitted).count();
  last_timing_.first_submit_seconds =
      std::chrono::duration<double>(first_submitted.value_or(submitted) - record_started).count();
  last_timing_.gpu_seconds.reset();
  last_timing_.stages.clear();
  if (timer_ && by_stage_) {
    if (auto t = timer_->since_start(static_cast<uint32_t>(stage_names.size()) + 1); t.ok()) {
      last_timing_.gpu_seconds = t->back();
      double before = 0;
      for (size_t i = 0; i < stage_names.size(); ++i) {
        auto it = std::find_if(last_timing_.stages.begin(), last_timing_.stages.end(),
                               [&](const auto& st) { return st.first == stage_names[i]; });
        if (it == last_timing_.stages.end()) it = last_timing_.stages.insert(it, {stage_names[i], 0.0});
        it->second += (*t)[i] - before;
        before = (*t)[i];
      }
    }
  } else if (timer_) {
    if (auto t = timer_->seconds(); t.ok()) last_timing_.gpu_seconds = *t;
  }
  std::vector<float> out(nlog * c.vocab);
  KVTIER_RETURN_IF_ERROR(logits_host_.invalidate(0, out.size() * 4));
  std::memcpy(out.data(), logits_host_.mapped(), out.size() * 4);
  last_timing_.readback_seconds = seconds_since(waited);
  return out;
}

}  // namespace kvtier
