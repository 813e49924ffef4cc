#include "bench/harness/ggml_peer.h"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <regex>
#include <sstream>

namespace kvtier::bench {
namespace {

std::optional<double> to_double(std::string_view s) {
  double v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

std::optional<int64_t> to_int(std::string_view s) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

// "a=1,b=[2,3],c=f16" split at the commas outside brackets.
std::map<std::string, std::string> split_params(std::string_view s) {
  std::map<std::string, std::string> out;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i < s.size() && s[i] == '[') ++depth;
    if (i < s.size() && s[i] == ']') --depth;
    if (i == s.size() || (s[i] == ',' && depth == 0)) {
      const std::string_view item = s.substr(start, i - start);
      if (const size_t eq = item.find('='); eq != std::string_view::npos) {
        out.emplace(std::string(item.substr(0, eq)), std::string(item.substr(eq + 1)));
      }
      start = i + 1;
    }
  }
  return out;
}

template <typename Match>
std::optional<double> fastest(const std::vector<GgmlPeerCase>& cases, Match match) {
  std::optional<double> best;
  for (const GgmlPeerCase& c : cases) {
    if (match(c) && (!best || c.us_per_run < *best)) best = c.us_per_run;
  }
  return best;
}

}  // namespace

std::optional<int64_t> GgmlPeerCase::integer(const std::string& key) const {
  const auto it = params.find(key);
  return it == params.end() ? std::nullopt : to_int(it->second);
}

std::vector<int64_t> GgmlPeerCase::integers(const std::string& key) const {
  const auto it = params.find(key);
  std::vector<int64_t> out;
  if (it == params.end() || it->second.size() < 2 || it->second.front() != '[' ||
      it->second.back() != ']') {
    return out;
  }
  std::stringstream items(it->second.substr(1, it->second.size() - 2));
  std::string item;
  while (std::getline(items, item, ',')) {
    const auto v = to_int(item);
    if (!v) return {};
    out.push_back(*v);
  }
  return out;
}

bool GgmlPeerCase::has(const std::string& key, const std::string& value) const {
  const auto it = params.find(key);
  return it != params.end() && it->second == value;
}

GgmlPeer GgmlPeer::parse(std::string_view text) {
  static const std::regex colour("\x1b\\[[0-9;]*m");
  static const std::regex line_re(R"(^\s*([A-Z_0-9]+)\((.*)\):\s+\d+ runs -\s+([0-9.]+) us/run)");
  GgmlPeer peer;
  std::stringstream lines{std::string(text)};
  std::string line;
  while (std::getline(lines, line)) {
    line = std::regex_replace(line, colour, "");
    std::smatch m;
    if (!std::regex_search(line, m, line_re)) continue;
    const std::optional<double> us = to_double(m[3].str());
    if (!us) continue;  // "." or "1.2.3": not a time, so not a perf line
    GgmlPeerCase c;
    c.op = m[1].str();
    c.params = split_params(m[2].str());
    c.us_per_run = *us;
    peer.cases_.push_back(std::move(c));
  }
  return peer;
}

Result<GgmlPeer> GgmlPeer::read(const std::string& path) {
  std::ifstream in(path);
  if (!in) return not_found("ggml peer run: cannot read " + path);
  std::stringstream text;
  text << in.rdbuf();
  GgmlPeer peer = parse(text.str());
  if (peer.cases_.empty()) {
    return invalid_argument("ggml peer run: " + path +
                            " has no test-backend-ops perf line (\"N runs - X us/run\")");
  }
  return peer;
}

std::optional<double> GgmlPeer::mul_mat_us(int64_t rows, int64_t k, int64_t n_out,
                                           const std::string& weight_type) const {
  auto shape = [&](const GgmlPeerCase& c) {
    return c.op == "MUL_MAT" && c.integer("m") == n_out && c.integer("n") == rows &&
           c.integer("k") == k && c.has("type_a", weight_type);
  };
  const bool any_f32 = std::any_of(cases_.begin(), cases_.end(), [&](const GgmlPeerCase& c) {
    return shape(c) && c.has("prec", "f32");
  });
  return fastest(cases_, [&](const GgmlPeerCase& c) {
    return shape(c) && (!any_f32 || c.has("prec", "f32"));
  });
}

std::optional<double> GgmlPeer::attention_us(int64_t head_dim, int64_t kv_heads, int64_t gqa,
                                             int64_t queries, int64_t context, int64_t sequences,
                                             bool causal) const {
  return fastest(cases_, [&](const GgmlPeerCase& c) {
    const std::vector<int64_t> nr = c.integers("nr23");
    const bool f16 = c.has("type_KV", "f16") || (c.has("type_K", "f16") && c.has("type_V", "f16"));
    return c.op == "FLASH_ATTN_EXT" && f16 && c.integer("hsk") == head_dim &&
           c.integer("hsv") == head_dim && c.integer("nh") == kv_heads && nr.size() == 2 &&
           nr[0] == gqa && nr[1] == sequences && c.integer("kv") == context &&
           c.integer("nb") == queries && c.has("mask_pattern", causal ? "causal" : "full");
  });
}

}  // namespace kvtier::bench
