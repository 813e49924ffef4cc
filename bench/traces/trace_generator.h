// Synthetic traces of the four workloads a prefix cache meets, generated deterministically from a
// seed (the same seed and scale give the same trace on every machine):
//   chat   shared system prompts (Zipf-popular) and sessions whose prompt grows turn by turn (each
//          turn's prompt is the last one plus the answer and a new message), with think times;
//   rag    Zipf-popular documents as prefixes, each followed by a unique question;
//   agent  one long shared tool prompt and many agents taking short steps whose outputs pile up;
//   scan   chat, with long one-off documents mixed in (read once, never again).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "bench/traces/trace.h"

namespace kvtier::bench {

struct TraceShape {
  double scale = 1.0;  // multiplies the number of sessions / requests (1.0: the benchmark's size)
  uint64_t seed = 1;
};

Result<Trace> generate_trace(std::string_view kind, TraceShape shape);
std::vector<std::string_view> trace_kinds();  // chat, rag, agent, scan

}  // namespace kvtier::bench
