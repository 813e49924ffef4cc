#version 460
// embedding: out[t, :] = table[tokens[t], :] (f32 rows of `dim`). Tokens out of range give an
// all-zero row (the launcher validates first; this only keeps a bad id from reading past the end).
#extension GL_GOOGLE_include_directive : require
#include "common/bda.glsl"

layout(local_size_x = 256) in;
layout(push_constant) uniform Params {
  uint64_t table;   // f32 [vocab, dim]
  uint64_t tokens;  // i32 [num_tokens]
  uint64_t out_;    // f32 [num_tokens, dim]
  uint num_tokens;
  uint dim;
  uint vocab;
} pc;

void main() {
  const uint i = gl_GlobalInvocationID.x;
  if (i >= pc.num_tokens * pc.dim) return;
  const uint t = i / pc.dim, d = i % pc.dim;
  const int tok = I32Ref(pc.tokens).v[t];
  F32Ref(pc.out_).v[i] =
      (tok >= 0 && uint(tok) < pc.vocab) ? F32Ref(pc.table + (uint64_t(tok) * pc.dim + d) * 4).v[0] : 0.0;
}
