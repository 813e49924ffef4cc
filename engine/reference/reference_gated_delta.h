// CPU references for Gated DeltaNet layers: the gated delta rule as the plain
// token-by-token recurrence, the same rule in the chunked form a GPU kernel computes (intra-chunk
// through the UT transform, state passed between chunks), and the causal depthwise conv1d + SiLU
// that feeds it. Float32 throughout; the recurrent state is what a hybrid model's prefix cache
// must snapshot beside its attention KV.
//
// Per head, with k and q rows of d_k, v rows of d_v and the state S (d_k x d_v, v = k S):
//   S_t = exp(g_t) (I - beta_t k_t^T k_t) S_{t-1} + beta_t k_t^T v_t,    o_t = scale q_t S_t
// g_t <= 0 is the log of the decay, beta_t in [0, 1] the write strength (models L2-normalise q and
// k; these functions take them as given).
#pragma once

#include <cstdint>
#include <span>

namespace kvtier::reference {

struct GatedDeltaShape {
  int heads = 0;
  int d_k = 0;
  int d_v = 0;
};

// One sequence of `tokens` tokens. q, k: [tokens, heads, d_k]; v, out: [tokens, heads, d_v];
// g, beta: [tokens, heads]; state: [heads, d_k, d_v], read as the state before the first token and
// overwritten with the state after the last.
struct GatedDeltaInputs {
  std::span<const float> q, k, v, g, beta;
  int tokens = 0;
  float scale = 1.0f;
};

// The recurrence, one token after another.
void gated_delta_recurrent(const GatedDeltaShape& shape, const GatedDeltaInputs& in, std::span<float> state,
                           std::span<float> out);

// The same rule in chunks of `chunk` tokens: within a chunk, the updates' corrections
// u = T (beta v - beta b k S_0) with T = (I + L)^-1 lower-triangular (L_ij = beta_i (b_i/b_j)
// k_i . k_j, j < i; b_i the chunk's cumulative decay), outputs b_i q_i S_0 + sum_{j<=i}
// (b_i/b_j) (q_i . k_j) u_j, and the state b_C S_0 + sum_j (b_C/b_j) k_j^T u_j passed on. Equal to
// the recurrence up to the order of float additions.
void gated_delta_chunked(const GatedDeltaShape& shape, const GatedDeltaInputs& in, int chunk,
                         std::span<float> state, std::span<float> out);

// Causal depthwise conv1d over time with SiLU after it, as GDN layers apply to their q, k, v
// projections. x, y: [tokens, channels]; weight: [channels, width]; bias: [channels] or empty;
// window: [channels, width - 1], the inputs before the first token (zeros for a fresh sequence),
// overwritten with the last width - 1 inputs: the conv state a prefix snapshot keeps.
void causal_conv1d_silu(std::span<const float> x, int tokens, int channels, std::span<const float> weight,
                        int width, std::span<const float> bias, std::span<float> window, std::span<float> y);

}  // namespace kvtier::reference
