#version 460
// embedding: out[t, :] = table[tokens[t], :] (f32 rows of `dim`). Tokens out of range give an
// all-zero row (the launcher validates first; this only keeps a bad id from reading past the end).
// VEC = 4 (dim a multiple of 4): four values per invocation, one 16-byte load and store.
#extension GL_GOOGLE_include_directive : require
#include "common/bda.glsl"

layout(local_size_x = 256) in;
layout(constant_id = 0) const uint VEC = 1;
layout(push_constant) uniform Params {
  uint64_t table;   // f32 [vocab, dim]
  uint64_t tokens;  // i32 [num_tokens]
  uint64_t out_;    // f32 [num_tokens, dim]
  uint num_tokens;
  uint dim;
  uint vocab;
} pc;

void main() {
  const uint i = gl_GlobalInvocationID.x, units = pc.dim / VEC;
  if (i >= pc.num_tokens * units) return;
  const uint t = i / units, u = i % units;
  const int tok = I32Ref(pc.tokens).v[t];
  const bool known = tok >= 0 && uint(tok) < pc.vocab;
  if (VEC == 4) {
    U32x4Ref(pc.out_).v[i] = known ? U32x4Ref(pc.table + uint64_t(tok) * pc.dim * 4).v[u] : uvec4(0);
  } else {
    F32Ref(pc.out_).v[i] = known ? F32Ref(pc.table + (uint64_t(tok) * pc.dim + u) * 4).v[0] : 0.0;
  }
}
