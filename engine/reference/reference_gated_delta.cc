#include "engine/reference/reference_gated_delta.h"

#include <cassert>
#include <cmath>
#include <vector>

namespace kvtier::reference {
namespace {

float dot(const float* a, const float* b, int n) {
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

void gated_delta_recurrent(const GatedDeltaShape& shape, const GatedDeltaInputs& in, std::span<float> state,
                           std::span<float> out) {
  const int H = shape.heads, K = shape.d_k, V = shape.d_v;
  std::vector<float> kS(V);
  for (int t = 0; t < in.tokens; ++t) {
    for (int h = 0; h < H; ++h) {
      const float* q = in.q.data() + (size_t(t) * H + h) * K;
      const float* k = in.k.data() + (size_t(t) * H + h) * K;
      const float* v = in.v.data() + (size_t(t) * H + h) * V;
      const float alpha = std::exp(in.g[size_t(t) * H + h]);
      const float beta = in.beta[size_t(t) * H + h];
      float* S = state.data() + size_t(h) * K * V;
      // S <- alpha S + beta k^T (v - alpha k S)
      for (int j = 0; j < V; ++j) {
        float s = 0.0f;
        for (int i = 0; i < K; ++i) s += k[i] * S[size_t(i) * V + j];
        kS[j] = alpha * s;
      }
      for (int i = 0; i < K; ++i) {
        for (int j = 0; j < V; ++j) {
          S[size_t(i) * V + j] = alpha * S[size_t(i) * V + j] + beta * k[i] * (v[j] - kS[j]);
        }
      }
      float* o = out.data() + (size_t(t) * H + h) * V;
      for (int j = 0; j < V; ++j) {
        float s = 0.0f;
        for (int i = 0; i < K; ++i) s += q[i] * S[size_t(i) * V + j];
        o[j] = in.scale * s;
      }
    }
  }
}

void gated_delta_chunked(const GatedDeltaShape& shape, const GatedDeltaInputs& in, int chunk,
                         std::span<float> state, std::span<float> out) {
  assert(chunk > 0);
  const int H = shape.heads, K = shape.d_k, V = shape.d_v;
  std::vector<float> G(chunk), u(size_t(chunk) * V), w(size_t(chunk) * K), S0(size_t(K) * V);
  for (int start = 0; start < in.tokens; start += chunk) {
    const int C = std::min(chunk, in.tokens - start);
    for (int h = 0; h < H; ++h) {
      auto q = [&](int i) { return in.q.data() + (size_t(start + i) * H + h) * K; };
      auto k = [&](int i) { return in.k.data() + (size_t(start + i) * H + h) * K; };
      auto v = [&](int i) { return in.v.data() + (size_t(start + i) * H + h) * V; };
      auto beta = [&](int i) { return in.beta[size_t(start + i) * H + h]; };
      float* S = state.data() + size_t(h) * K * V;
      // Cumulative log-decays inside the chunk: b_i = exp(G_i); ratios b_i / b_j = exp(G_i - G_j)
      // stay <= 1 for j <= i, so nothing overflows however long the chunk.
      float acc = 0.0f;
      for (int i = 0; i < C; ++i) G[i] = acc += in.g[size_t(start + i) * H + h];
      // Forward substitution through (I + L): row i of the corrections needs rows j < i.
      //   u_i = beta_i v_i - sum_{j<i} L_ij u_j;   w_i = beta_i b_i k_i - sum_{j<i} L_ij w_j
      // so that the true corrections are u_i - w_i S_0.
      for (int i = 0; i < C; ++i) {
        float* ui = u.data() + size_t(i) * V;
        float* wi = w.data() + size_t(i) * K;
        const float bi = beta(i);
        const float decay_i = std::exp(G[i]);
        for (int j = 0; j < V; ++j) ui[j] = bi * v(i)[j];
        for (int j = 0; j < K; ++j) wi[j] = bi * decay_i * k(i)[j];
        for (int j = 0; j < i; ++j) {
          const float l = bi * std::exp(G[i] - G[j]) * dot(k(i), k(j), K);
          const float* uj = u.data() + size_t(j) * V;
          const float* wj = w.data() + size_t(j) * K;
          for (int c = 0; c < V; ++c) ui[c] -= l * uj[c];
          for (int c = 0; c < K; ++c) wi[c] -= l * wj[c];
        }
      }
      // u <- u - w S_0: the corrections against the state the chunk started from.
      for (int i = 0; i < C; ++i) {
        for (int c = 0; c < V; ++c) {
          float s = 0.0f;
          for (int r = 0; r < K; ++r) s += w[size_t(i) * K + r] * S[size_t(r) * V + c];
          u[size_t(i) * V + c] -= s;
        }
      }
      // Outputs: b_i q_i S_0 + sum_{j<=i} (b_i/b_j) (q_i . k_j) u_j.
      for (int i = 0; i < C; ++i) {
        float* o = out.data() + (size_t(start + i) * H + h) * V;
        const float decay_i = std::exp(G[i]);
        for (int c = 0; c < V; ++c) {
          float s = 0.0f;
          for (int r = 0; r < K; ++r) s += q(i)[r] * S[size_t(r) * V + c];
          o[c] = decay_i * s;
        }
        for (int j = 0; j <= i; ++j) {
          const float a = std::exp(G[i] - G[j]) * dot(q(i), k(j), K);
          for (int c = 0; c < V; ++c) o[c] += a * u[size_t(j) * V + c];
        }
        for (int c = 0; c < V; ++c) o[c] *= in.scale;
      }
      // State passed on: b_C S_0 + sum_j (b_C/b_j) k_j^T u_j.
      S0.assign(S, S + size_t(K) * V);
      const float decay_c = std::exp(G[C - 1]);
      for (int r = 0; r < K; ++r) {
        for (int c = 0; c < V; ++c) {
          float s = decay_c * S0[size_t(r) * V + c];
          for (int j = 0; j < C; ++j) s += std::exp(G[C - 1] - G[j]) * k(j)[r] * u[size_t(j) * V + c];
          S[size_t(r) * V + c] = s;
        }
      }
    }
  }
}

void causal_conv1d_silu(std::span<const float> x, int tokens, int channels, std::span<const float> weight,
                        int width, std::span<const float> bias, std::span<float> window, std::span<float> y) {
  const int past = width - 1;
  for (int t = 0; t < tokens; ++t) {
    for (int c = 0; c < channels; ++c) {
      // Input at time t - (width - 1 - w) for tap w; before the first token it comes from the window.
      float s = bias.empty() ? 0.0f : bias[c];
      for (int tap = 0; tap < width; ++tap) {
        const int at = t - (past - tap);
        const float in = at >= 0 ? x[size_t(at) * channels + c] : window[size_t(c) * past + (past + at)];
        s += weight[size_t(c) * width + tap] * in;
      }
      y[size_t(t) * channels + c] = s / (1.0f + std::exp(-s));
    }
  }
  // The window after the last token: its last `past` inputs, the older ones from the old window.
  std::vector<float> next(size_t(channels) * past);
  for (int c = 0; c < channels; ++c) {
    for (int p = 0; p < past; ++p) {
      const int at = tokens - past + p;
      next[size_t(c) * past + p] = at >= 0 ? x[size_t(at) * channels + c] : window[size_t(c) * past + (past + at)];
    }
  }
  std::copy(next.begin(), next.end(), window.begin());
}

}  // namespace kvtier::reference
