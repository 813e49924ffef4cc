#include "bench/traces/trace.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

namespace kvtier::bench {

namespace {
uint64_t mix(uint64_t x) {  // splitmix64's finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
}  // namespace

size_t TraceRequest::tokens() const {
  size_t n = 0;
  for (const auto& [id, len] : segments) n += len;
  return n;
}

std::vector<uint32_t> TraceRequest::expand() const {
  std::vector<uint32_t> out;
  out.reserve(tokens());
  for (const auto& [id, len] : segments) {
    for (uint32_t i = 0; i < len; ++i) out.push_back(static_cast<uint32_t>(mix(id * 0x9e3779b97f4a7c15ull + i) % 128000));
  }
  return out;
}

Trace Trace::head(double fraction) const {
  if (fraction >= 1.0) return *this;
  const size_t n =
      std::max<size_t>(1, static_cast<size_t>(static_cast<double>(requests.size()) * fraction));
  Trace t{name + "-first" + std::to_string(static_cast<int>(fraction * 100 + 0.5)) + "%",
          {},
          block_tokens};
  t.requests.assign(requests.begin(), requests.begin() + std::min(n, requests.size()));
  return t;
}

Status write_trace_jsonl(const Trace& trace, const std::string& path) {
  std::ofstream out(path, std::ios::trunc);
  if (!out) return io_error("cannot write " + path);
  for (const TraceRequest& r : trace.requests) {
    nlohmann::json j{{"ts", r.ts}, {"session", r.session}, {"segments", r.segments}};
    out << j.dump() << "\n";
  }
  return out ? ok_status() : io_error("writing " + path + " failed");
}

Result<Trace> read_trace_jsonl(const std::string& path) {
  std::ifstream in(path);
  if (!in) return not_found("cannot read " + path);
  Trace t;
  t.name = std::filesystem::path(path).stem().string();
  std::string line;
  size_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.contains("segments")) {
      return invalid_argument(path + " line " + std::to_string(n) + ": not a trace request");
    }
    TraceRequest r;
    r.ts = j.value("ts", 0.0);
    r.session = j.value("session", uint64_t{0});
    r.segments = j["segments"].get<std::vector<std::pair<uint64_t, uint32_t>>>();
    t.requests.push_back(std::move(r));
  }
  return t;
}

}  // namespace kvtier::bench
