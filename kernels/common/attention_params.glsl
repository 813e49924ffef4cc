// Score transforms shared by the attention kernels: scale, optional logit soft-capping
// (softcap * tanh(score / softcap), as in Gemma 2) and masking to -inf.
const float NEG_INF = -1.0 / 0.0;

float attention_score(float dot_qk, float scale, float softcap) {
  float s = dot_qk * scale;
  if (softcap > 0.0) s = softcap * tanh(s / softcap);
  return s;
}
