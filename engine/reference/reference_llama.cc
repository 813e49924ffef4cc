#include "engine/reference/reference_llama.h"

#include <algorithm>
#include <cmath>

namespace kvtier::reference {

namespace {

std::vector<float> rms_norm(const std::vector<float>& x, const std::vector<float>& w, float eps) {
  float ss = 0;
  for (float v : x) ss += v * v;
  const float inv = 1.0f / std::sqrt(ss / static_cast<float>(x.size()) + eps);
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = x[i] * inv * w[i];
  return out;
}

// y = x @ W, W [in, out] row-major.
std::vector<float> matvec(const std::vector<float>& x, const std::vector<float>& w, size_t out) {
  std::vector<float> y(out, 0.0f);
  for (size_t i = 0; i < x.size(); ++i) {
    for (size_t o = 0; o < out; ++o) y[o] += x[i] * w[i * out + o];
  }
  return y;
}

void rope(float* v, int pos, int dim, const LlamaWeights& w) {
  const int half = dim / 2;
  for (int j = 0; j < half; ++j) {
    const float c = w.rope_cos[static_cast<size_t>(pos) * half + j];
    const float s = w.rope_sin[static_cast<size_t>(pos) * half + j];
    const float a = v[j], b = v[j + half];
    v[j] = a * c - b * s;
    v[j + half] = b * c + a * s;
  }
}

}  // namespace

std::vector<float> ReferenceLlama::step(int32_t token, int pos) {
  const int h = c_.hidden(), hd = c_.head_dim, kvd = c_.num_kv_heads * hd;
  const int gqa = c_.num_heads / c_.num_kv_heads;
  std::vector<float> x(w_.embedding.begin() + static_cast<size_t>(token) * h,
                       w_.embedding.begin() + static_cast<size_t>(token + 1) * h);
  for (int l = 0; l < c_.num_layers; ++l) {
    const LlamaWeights::Layer& L = w_.layers[l];
    auto hn = rms_norm(x, L.attn_norm, c_.rms_eps);
    auto q = matvec(hn, L.wq, h);
    auto k = matvec(hn, L.wk, kvd);
    auto v = matvec(hn, L.wv, kvd);
    for (int head = 0; head < c_.num_heads; ++head) rope(&q[head * hd], pos, hd, w_);
    for (int head = 0; head < c_.num_kv_heads; ++head) rope(&k[head * hd], pos, hd, w_);
    for (float& e : k) e = round_to_dtype(kv_dtype_, e);  // as stored in the cache
    for (float& e : v) e = round_to_dtype(kv_dtype_, e);
    k_[l].insert(k_[l].end(), k.begin(), k.end());
    v_[l].insert(v_[l].end(), v.begin(), v.end());
    std::vector<float> attn(h, 0.0f);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    for (int head = 0; head < c_.num_heads; ++head) {
      const int kh = head / gqa;
      std::vector<float> s(pos + 1);
      float m = -INFINITY;
      for (int t = 0; t <= pos; ++t) {
        float dot = 0;
        for (int i = 0; i < hd; ++i) dot += q[head * hd + i] * k_[l][static_cast<size_t>(t) * kvd + kh * hd + i];
        s[t] = dot * scale;
        m = std::max(m, s[t]);
      }
      float sum = 0;
      for (float& e : s) {
        e = std::exp(e - m);
        sum += e;
      }
      for (int i = 0; i < hd; ++i) {
        float acc = 0;
        for (int t = 0; t <= pos; ++t) acc += s[t] * v_[l][static_cast<size_t>(t) * kvd + kh * hd + i];
        attn[head * hd + i] = acc / sum;
      }
    }
    auto o = matvec(attn, L.wo, h);
    for (int i = 0; i < h; ++i) x[i] += o[i];
    hn = rms_norm(x, L.mlp_norm, c_.rms_eps);
    auto g = matvec(hn, L.w_gate, c_.ffn);
    auto u = matvec(hn, L.w_up, c_.ffn);
    for (int i = 0; i < c_.ffn; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    auto d = matvec(g, L.w_down, h);
    for (int i = 0; i < h; ++i) x[i] += d[i];
  }
  return rms_norm(x, w_.final_norm, c_.rms_eps);
}

std::vector<float> ReferenceLlama::logits(const std::vector<float>& hidden) const {
  return matvec(hidden, w_.embedding_t, c_.vocab);
}

ReferenceLlama::Output ReferenceLlama::generate(std::span<const int32_t> prompt, int max_new) {
  k_.assign(c_.num_layers, {});
  v_.assign(c_.num_layers, {});
  Output out;
  std::vector<float> hidden;
  int pos = 0;
  for (int32_t t : prompt) hidden = step(t, pos++);
  for (int i = 0; i < max_new; ++i) {
    auto l = logits(hidden);
    const int32_t next = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
    out.tokens.push_back(next);
    out.logits.push_back(std::move(l));
    if (i + 1 < max_new) hidden = step(next, pos++);
  }
  return out;
}

}  // namespace kvtier::reference
