#include "bench/traces/mooncake_trace.h"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

namespace kvtier::bench {
namespace {

// Segment ids of Mooncake blocks, apart from the synthetic generators' (trace_generator.cc uses
// kinds 1-7 in the top byte).
constexpr uint64_t kMooncakeBlock = 8ull << 56;

Status malformed(const std::string& path, size_t line, const std::string& why) {
  return invalid_argument(path + " line " + std::to_string(line) + ": " + why);
}

}  // namespace

Result<Trace> read_mooncake_trace(const std::string& path) {
  std::ifstream in(path);
  if (!in) return not_found("cannot read " + path);
  Trace t;
  t.name = std::filesystem::path(path).stem().string();
  t.block_tokens = kMooncakeBlockTokens;
  std::string text;
  for (size_t line = 1; std::getline(in, text); ++line) {
    if (text.empty()) continue;
    const auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return malformed(path, line, "not a JSON object");
    const auto ids = j.find("hash_ids");
    const auto length = j.find("input_length");
    if (ids == j.end() || !ids->is_array() || length == j.end() || !length->is_number_unsigned()) {
      return malformed(path, line, "a Mooncake request needs hash_ids (array) and input_length");
    }
    const uint64_t tokens = length->get<uint64_t>();
    if (ids->empty() || tokens == 0) continue;  // nothing to look up
    // The blocks before the last are whole; an input_length they would not cover is an error
    // rather than a guess at which block is short.
    if (tokens <= (ids->size() - 1) * kMooncakeBlockTokens ||
        tokens > ids->size() * kMooncakeBlockTokens) {
      return malformed(path, line,
                       std::to_string(ids->size()) +
                           " blocks of 512 tokens cannot hold input_length " +
                           std::to_string(tokens));
    }
    TraceRequest r;
    r.ts = j.value("timestamp", 0.0) / 1000.0;
    r.session = line;  // the trace names no sessions
    for (size_t i = 0; i < ids->size(); ++i) {
      if (!(*ids)[i].is_number_unsigned())
        return malformed(path, line, "a hash id is not an unsigned integer");
      const uint64_t id = (*ids)[i].get<uint64_t>();
      if (id >= (1ull << 56))
        return malformed(path, line, "hash id " + std::to_string(id) + " is out of range");
      const uint64_t left = tokens - i * kMooncakeBlockTokens;
      r.segments.push_back({kMooncakeBlock + id,
                            static_cast<uint32_t>(std::min<uint64_t>(left, kMooncakeBlockTokens))});
    }
    t.requests.push_back(std::move(r));
  }
  if (in.bad()) return io_error("reading " + path + " failed");
  return t;
}

Result<Trace> read_trace_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return not_found("cannot read " + path);
  std::string first;
  while (std::getline(in, first) && first.empty()) {
  }
  if (first.find("\"hash_ids\"") != std::string::npos) return read_mooncake_trace(path);
  return read_trace_jsonl(path);
}

}  // namespace kvtier::bench
