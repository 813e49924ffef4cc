#include "bench/traces/trace_generator.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace kvtier::bench {
namespace {

// Our own distributions over mt19937_64 (whose output the standard fixes): the standard library's
// distributions differ between implementations, and a trace must not.
class Rng {
 public:
  explicit Rng(uint64_t seed) : g_(seed) {}
  double uniform() { return static_cast<double>(g_() >> 11) * 0x1.0p-53; }
  uint32_t between(uint32_t lo, uint32_t hi) {  // inclusive
    return lo + static_cast<uint32_t>(uniform() * (hi - lo + 1));
  }
  double exponential(double mean) { return -mean * std::log(1.0 - uniform()); }

 private:
  std::mt19937_64 g_;
};

// Zipf(s) over [0, n): a precomputed CDF.
class Zipf {
 public:
  Zipf(size_t n, double s) : cdf_(n) {
    double sum = 0;
    for (size_t k = 0; k < n; ++k) cdf_[k] = sum += 1.0 / std::pow(static_cast<double>(k + 1), s);
    for (double& c : cdf_) c /= sum;
  }
  size_t sample(Rng& rng) const {
    return std::min(cdf_.size() - 1,
                    static_cast<size_t>(std::lower_bound(cdf_.begin(), cdf_.end(), rng.uniform()) - cdf_.begin()));
  }

 private:
  std::vector<double> cdf_;
};

// Segment ids by kind, so segments of different kinds never collide.
constexpr uint64_t kSystem = 1ull << 56, kTurn = 2ull << 56, kDocument = 3ull << 56, kQuestion = 4ull << 56,
                   kTool = 5ull << 56, kStep = 6ull << 56, kOneOff = 7ull << 56;

size_t scaled(double base, double scale) { return std::max<size_t>(1, static_cast<size_t>(base * scale)); }

void sort_by_time(Trace& t) {
  std::stable_sort(t.requests.begin(), t.requests.end(),
                   [](const TraceRequest& a, const TraceRequest& b) { return a.ts < b.ts; });
}

// Conversations: a session picks a system prompt and talks for a few turns; every turn's prompt
// is the whole conversation so far.
void add_chat(Trace& t, Rng& rng, size_t sessions, uint64_t session_base) {
  const size_t n_system = 24;
  std::vector<uint32_t> system_len(n_system);
  for (auto& l : system_len) l = rng.between(256, 2048);
  const Zipf popular(n_system, 1.0);
  double arrival = 0;
  for (size_t s = 0; s < sessions; ++s) {
    arrival += rng.exponential(4.0);
    const size_t sys = popular.sample(rng);
    const uint64_t session = session_base + s;
    std::vector<std::pair<uint64_t, uint32_t>> prompt{{kSystem + sys, system_len[sys]}};
    const uint32_t turns = 1 + static_cast<uint32_t>(rng.exponential(4.0));
    double ts = arrival;
    for (uint32_t turn = 0; turn < std::min(turns, 16u); ++turn) {
      prompt.push_back({kTurn + (session << 16) + 2 * turn, rng.between(16, 200)});  // the user
      t.requests.push_back({ts, session, prompt});
      prompt.push_back({kTurn + (session << 16) + 2 * turn + 1, rng.between(40, 400)});  // the answer
      ts += rng.exponential(45.0);  // reading and typing
    }
  }
}

Trace chat(const TraceShape& shape) {
  Trace t{"chat", {}};
  Rng rng(shape.seed);
  add_chat(t, rng, scaled(600, shape.scale), 0);
  sort_by_time(t);
  return t;
}

Trace rag(const TraceShape& shape) {
  Trace t{"rag", {}};
  Rng rng(shape.seed + 1);
  const size_t n_docs = 400;
  std::vector<uint32_t> doc_len(n_docs);
  for (auto& l : doc_len) l = rng.between(512, 4096);
  const Zipf popular(n_docs, 0.9);
  double ts = 0;
  for (size_t q = 0, n = scaled(4000, shape.scale); q < n; ++q) {
    ts += rng.exponential(0.5);
    const size_t doc = popular.sample(rng);
    t.requests.push_back({ts, q, {{kSystem, 200}, {kDocument + doc, doc_len[doc]}, {kQuestion + q, rng.between(16, 96)}}});
  }
  return t;
}

Trace agent(const TraceShape& shape) {
  Trace t{"agent", {}};
  Rng rng(shape.seed + 2);
  const uint32_t tool_prompt = 6000;
  for (size_t a = 0, n = scaled(120, shape.scale); a < n; ++a) {
    std::vector<std::pair<uint64_t, uint32_t>> prompt{{kTool, tool_prompt}, {kStep + (a << 16), rng.between(50, 300)}};
    double ts = rng.uniform() * 600;
    for (uint32_t step = 1, steps = rng.between(8, 40); step <= steps; ++step) {
      t.requests.push_back({ts, a, prompt});
      prompt.push_back({kStep + (a << 16) + step, rng.between(60, 600)});  // a tool call and its output
      ts += rng.exponential(3.0);
    }
  }
  sort_by_time(t);
  return t;
}

Trace scan(const TraceShape& shape) {
  Trace t{"scan", {}};
  Rng rng(shape.seed + 3);
  add_chat(t, rng, scaled(600, shape.scale), 0);
  sort_by_time(t);
  const double end = t.requests.empty() ? 0 : t.requests.back().ts;
  // Long one-off documents (summarize this, translate that): a third as many as chat requests.
  for (size_t d = 0, n = t.requests.size() / 3; d < n; ++d) {
    t.requests.push_back({rng.uniform() * end, 1'000'000 + d, {{kOneOff + d, rng.between(4096, 12288)}}});
  }
  sort_by_time(t);
  return t;
}

}  // namespace

std::vector<std::string_view> trace_kinds() { return {"chat", "rag", "agent", "scan"}; }

Result<Trace> generate_trace(std::string_view kind, TraceShape shape) {
  if (kind == "chat") return chat(shape);
  if (kind == "rag") return rag(shape);
  if (kind == "agent") return agent(shape);
  if (kind == "scan") return scan(shape);
  return invalid_argument("unknown trace kind '" + std::string(kind) + "' (chat, rag, agent, scan)");
}

}  // namespace kvtier::bench
