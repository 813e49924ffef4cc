#version 460
// causal_conv1d: the causal depthwise conv1d + SiLU of Gated DeltaNet layers
// (engine/reference/reference_gated_delta.h), for a batch of sequences, each continuing from (and
// leaving) its window of the last width - 1 inputs in a window pool: the conv state a hybrid
// prefix snapshot keeps beside the recurrent state. One invocation per (channel, sequence); the
// window lives in its registers; sums in the reference's order, no fused multiply-adds. One launch
// takes tokens [token_begin, token_begin + token_count) of every sequence (llvmpipe's loop limit:
// see gated_delta_recurrent.comp).
#extension GL_GOOGLE_include_directive : require
#include "common/bda.glsl"

#define MAX_PAST 7  // width <= 8
layout(local_size_x = 64) in;
layout(push_constant) uniform Params {
  uint64_t x;            // f32 [tokens, channels]
  uint64_t weight;       // f32 [channels, width]
  uint64_t bias;         // f32 [channels], or 0 for none
  uint64_t window;       // f32 [slots, channels, width - 1], read and written in place
  uint64_t y;            // f32 [tokens, channels]
  uint64_t cu_tokens;    // i32 [sequences + 1]
  uint64_t window_slots; // i32 [sequences]
  uint channels;
  uint width;
  uint token_begin;
  uint token_count;
} pc;

float load(uint64_t base, uint64_t i) { return F32Ref(base).v[uint(i)]; }
void store(uint64_t base, uint64_t i, float v) { F32Ref(base).v[uint(i)] = v; }

void main() {
  const uint c = gl_GlobalInvocationID.x;
  const uint seq = gl_WorkGroupID.y;
  if (c >= pc.channels) return;
  const uint C = pc.channels, W = pc.width, past = W - 1;
  const uint seq_first = uint(I32Ref(pc.cu_tokens).v[seq]);
  const uint seq_last = uint(I32Ref(pc.cu_tokens).v[seq + 1]);
  const uint first = min(seq_first + pc.token_begin, seq_last);
  const uint last = min(first + pc.token_count, seq_last);
  if (first == last) return;
  const uint64_t window_at = (uint64_t(I32Ref(pc.window_slots).v[seq]) * C + c) * past;

  float win[MAX_PAST];  // win[p]: the input p - past tokens before the current one (oldest first)
  for (uint p = 0; p < past; ++p) win[p] = load(pc.window, window_at + p);
  const float b = pc.bias == 0ul ? 0.0 : load(pc.bias, c);
  for (uint t = first; t < last; ++t) {
    const float xt = load(pc.x, uint64_t(t) * C + c);
    precise float s = b;
    for (uint tap = 0; tap < past; ++tap) s = s + load(pc.weight, uint64_t(c) * W + tap) * win[tap];
    s = s + load(pc.weight, uint64_t(c) * W + past) * xt;
    store(pc.y, uint64_t(t) * C + c, s / (1.0 + exp(-s)));
    for (uint p = 0; p + 1 < past; ++p) win[p] = win[p + 1];
    if (past > 0) win[past - 1] = xt;
  }
  for (uint p = 0; p < past; ++p) store(pc.window, window_at + p, win[p]);
}
