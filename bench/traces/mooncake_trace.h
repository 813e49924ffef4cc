// Mooncake's published request traces (kvcache-ai/Mooncake, FAST25-release/traces; Apache-2.0),
// read as kvtier traces. Each line is one request:
//   {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 2353]}
// timestamp in milliseconds; hash_ids are remapped prefix hashes of 512-token blocks (equal ids at
// the same place: an equal prefix up to there); the last block holds what input_length leaves.
// A hash id becomes a segment of its block's tokens, so equal ids give equal prefixes, and the
// trace asks to be replayed at 512-token blocks (the finest grain it knows prefixes at).
#pragma once

#include <string>

#include "bench/traces/trace.h"

namespace kvtier::bench {

inline constexpr uint32_t kMooncakeBlockTokens = 512;

Result<Trace> read_mooncake_trace(const std::string& path);

// A trace file of either format, told apart by its first request ("hash_ids": Mooncake's).
Result<Trace> read_trace_file(const std::string& path);

}  // namespace kvtier::bench
