// Merging two online-softmax states (running max m, sum of weights l, weighted values acc), the
// one step both the varlen kernel (merging its splits in a loop) and the varlen merge pass use,
// so a row's result is the same bits whichever of them combined its splits. A state with l == 0
// (a split the row does not reach) is skipped by the callers; merging into an empty running
// state takes the other state as it is.

// Factors for acc_a * fa + acc_b * fb, and the merged max.
void merge_factors(float m_a, float m_b, out float m, out float fa, out float fb) {
  m = max(m_a, m_b);
  fa = exp(m_a - m);
  fb = exp(m_b - m);
}
