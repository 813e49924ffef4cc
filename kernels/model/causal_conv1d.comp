#version 460
// causal_conv1d: the causal depthwise conv1d + SiLU of Gated DeltaNet layers
// (engine/reference/reference_gated_delta.h), for a batch of sequences, each continuing from (and
// leaving) its window of the last width - 1 inputs in a window pool: the conv state a hybrid
// prefix snapshot keeps beside the recurrent state. An output needs only its own input and the
// width - 1 before it (from the sequence's rows, or its window before its first row), so the
// outputs launch runs every (16 tokens, channel) of every sequence at once; the window launch,
// after it, writes each sequence's last width - 1 inputs back. Sums in the reference's order, no
// fused multiply-adds, so outputs have the reference's bits but for exp.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "common/bda.glsl"

layout(constant_id = 0) const uint WIDTH = 4;  // <= 8; fixed per pipeline, so the window is registers
#define PAST (WIDTH - 1)
#define TOKENS 16  // outputs per invocation, one after another (each input loaded once)
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
  uint part;             // 0: outputs (grid y: blocks of TOKENS rows); 1: the windows
  uint block_begin;      // outputs: the launch's first block of rows (grid y counts from it)
  uint pad;
} pc;

float load(uint64_t base, uint64_t i) { return F32Ref(base).v[uint(i)]; }
void store(uint64_t base, uint64_t i, float v) { F32Ref(base).v[uint(i)] = v; }

// Input `rel` rows after the sequence's first (negative: from its window, oldest first).
float input_at(int rel, uint seq_first, uint c, uint64_t window_at) {
  return rel >= 0 ? load(pc.x, uint64_t(seq_first + uint(rel)) * pc.channels + c)
                  : load(pc.window, window_at + uint(int(PAST) + rel));
}

void main() {
  const uint c = gl_GlobalInvocationID.x;
  const uint seq = gl_WorkGroupID.z;
  if (c >= pc.channels) return;
  const uint C = pc.channels;
  const uint seq_first = uint(I32Ref(pc.cu_tokens).v[seq]);
  const int n = I32Ref(pc.cu_tokens).v[seq + 1] - int(seq_first);
  const uint64_t window_at = (uint64_t(I32Ref(pc.window_slots).v[seq]) * C + c) * PAST;
  if (pc.part == 1) {  // the last PAST inputs, read before any is written
    float last[PAST + 1];
    [[unroll]] for (uint p = 0; p < PAST; ++p) last[p] = input_at(n - int(PAST) + int(p), seq_first, c, window_at);
    [[unroll]] for (uint p = 0; p < PAST; ++p) store(pc.window, window_at + p, last[p]);
    return;
  }
  const int first = int((pc.block_begin + gl_WorkGroupID.y) * TOKENS);
  if (first >= n) return;
  float win[PAST + 1];  // win[p]: the input PAST - p rows before the current one
  [[unroll]] for (uint p = 0; p < PAST; ++p) win[p] = input_at(first - int(PAST) + int(p), seq_first, c, window_at);
  float w[WIDTH];
  [[unroll]] for (uint tap = 0; tap < WIDTH; ++tap) w[tap] = load(pc.weight, uint64_t(c) * WIDTH + tap);
  const float b = pc.bias == 0ul ? 0.0 : load(pc.bias, c);
  const int last = min(first + TOKENS, n);
  for (int t = first; t < last; ++t) {
    const float xt = load(pc.x, uint64_t(seq_first + uint(t)) * C + c);
    precise float s = b;
    [[unroll]] for (uint tap = 0; tap < PAST; ++tap) s = s + w[tap] * win[tap];
    s = s + w[PAST] * xt;
    store(pc.y, uint64_t(seq_first + uint(t)) * C + c, s / (1.0 + exp(-s)));
    [[unroll]] for (uint p = 0; p + 1 < PAST; ++p) win[p] = win[p + 1];
    if (PAST > 0) win[PAST - 1] = xt;
  }
}
