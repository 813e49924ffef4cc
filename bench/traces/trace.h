// Traces of LLM serving requests, for measuring hit ratios (bench/hit_ratio_bench and its test).
// A request is its arrival time and its prompt as segments — a shared system prompt, a document,
// a turn of a conversation — each segment an id and a length; a segment's tokens are a fixed
// function of its id, so equal segments are equal prefixes and a trace file stays small. Traces
// are JSON lines, one request per line:
//   {"ts": 12.5, "session": 3, "segments": [[72057594037927936, 1024], [144115188075855872, 180]]}
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"

namespace kvtier::bench {

struct TraceRequest {
  double ts = 0;         // seconds since the trace began
  uint64_t session = 0;  // who sent it (a conversation, an agent, a RAG query)
  std::vector<std::pair<uint64_t, uint32_t>> segments;  // (segment id, tokens)

  size_t tokens() const;
  // The prompt's token ids: segment by segment, token i of segment s a hash of (s, i).
  std::vector<uint32_t> expand() const;
};

struct Trace {
  std::string name;
  std::vector<TraceRequest> requests;  // in arrival order
  // The block size to replay it at: the finest grain its prefixes are known at (a trace of
  // hashed 512-token blocks says nothing finer).
  uint32_t block_tokens = 16;

  // Its first `fraction` of requests (at least one), named so.
  Trace head(double fraction) const;
};

Status write_trace_jsonl(const Trace& trace, const std::string& path);
Result<Trace> read_trace_jsonl(const std::string& path);

}  // namespace kvtier::bench
