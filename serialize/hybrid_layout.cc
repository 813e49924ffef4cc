#include "serialize/hybrid_layout.h"

#include <xxhash.h>

#include <cstdio>

#include <nlohmann/json.hpp>

namespace kvtier {
namespace {

using nlohmann::json;

Status only_keys(const json& j, std::initializer_list<const char*> allowed, const std::string& where) {
  if (!j.is_object()) return invalid_argument(where + ": must be an object");
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool known = false;
    for (const char* k : allowed) known = known || it.key() == k;
    if (!known) return invalid_argument(where + ": unknown field '" + it.key() + "'");
  }
  return ok_status();
}

Result<int> positive_int(const json& j, const char* key, const std::string& where, std::optional<int> fallback = {}) {
  if (!j.contains(key)) {
    if (fallback) return *fallback;
    return invalid_argument(where + ": missing field '" + key + "'");
  }
  if (!j[key].is_number_integer()) return invalid_argument(where + ": field '" + key + "' must be an integer");
  const int64_t v = j[key].get<int64_t>();
  if (v < 1 || v > (1 << 20)) {
    return invalid_argument(where + ": field '" + key + "' must be in [1, 2^20], got " + std::to_string(v));
  }
  return static_cast<int>(v);
}

}  // namespace

Result<HybridLayout> HybridLayout::from_json(const json& j) {
  const std::string where = "hybrid layout";
  KVTIER_RETURN_IF_ERROR(only_keys(j, {"name", "block_size", "dtype", "attention", "gdn", "pattern"}, where));
  HybridLayout h;
  if (j.contains("name")) {
    if (!j["name"].is_string()) return invalid_argument(where + ": field 'name' must be a string");
    h.name_ = j["name"].get<std::string>();
  }
  if (!j.contains("pattern") || !j["pattern"].is_array() || j["pattern"].empty()) {
    return invalid_argument(where + ": 'pattern' must be a non-empty array of \"attention\" and \"gdn\"");
  }
  for (size_t i = 0; i < j["pattern"].size(); ++i) {
    const json& p = j["pattern"][i];
    if (p == "attention") h.pattern_.push_back(LayerKind::kAttention);
    else if (p == "gdn") h.pattern_.push_back(LayerKind::kGatedDeltaNet);
    else return invalid_argument(where + ": pattern[" + std::to_string(i) + "] is " + p.dump() +
                                 ", not \"attention\" or \"gdn\"");
  }
  const int attention_layers = static_cast<int>(h.pattern_.size()) - h.gdn_layers();
  if (attention_layers == 0) return invalid_argument(where + ": the pattern has no attention layer");
  if (!j.contains("attention")) return invalid_argument(where + ": missing field 'attention'");
  const json& a = j["attention"];
  KVTIER_RETURN_IF_ERROR(only_keys(a, {"num_kv_heads", "head_dim"}, where + ".attention"));
  // The attention layers' KV layout, through KvLayout's own parser and checks.
  json kv = {{"num_layers", attention_layers}, {"num_kv_heads", a.value("num_kv_heads", json())},
             {"head_dim", a.value("head_dim", json())}, {"block_size", j.value("block_size", json(16))},
             {"dtype", j.value("dtype", json())}};
  if (!h.name_.empty()) kv["name"] = h.name_;
  auto attention = KvLayout::from_json(kv);
  if (!attention.ok()) return invalid_argument(where + ": " + attention.status().message());
  h.attention_ = std::move(attention).value();
  if (h.gdn_layers() > 0) {
    if (!j.contains("gdn")) return invalid_argument(where + ": the pattern has gdn layers but no field 'gdn'");
    const json& g = j["gdn"];
    const std::string gw = where + ".gdn";
    KVTIER_RETURN_IF_ERROR(only_keys(g, {"heads", "d_k", "d_v", "conv_width", "conv_channels"}, gw));
    KVTIER_ASSIGN_OR_RETURN(h.gdn_.heads, positive_int(g, "heads", gw));
    KVTIER_ASSIGN_OR_RETURN(h.gdn_.d_k, positive_int(g, "d_k", gw));
    KVTIER_ASSIGN_OR_RETURN(h.gdn_.d_v, positive_int(g, "d_v", gw));
    KVTIER_ASSIGN_OR_RETURN(h.gdn_.conv_width, positive_int(g, "conv_width", gw, 4));
    KVTIER_ASSIGN_OR_RETURN(h.gdn_.conv_channels, positive_int(g, "conv_channels", gw));
    if (h.gdn_.conv_width > 8) return invalid_argument(gw + ": conv_width must be at most 8");
    // A layer's state travels as one layer of a state record (serialize/state_record.h): K and V
    // of block_size rows of at most 1024 heads of 1024 floats.
    const size_t floats = h.gdn_.state_floats() + h.gdn_.window_floats();
    const size_t most = 2 * size_t(h.attention_.block_size) * 1024 * 1024;
    if (floats > most) {
      return invalid_argument(gw + ": one layer's state and window are " + std::to_string(floats) +
                              " floats; a state record holds at most " + std::to_string(most) + " at block_size " +
                              std::to_string(h.attention_.block_size));
    }
    if (h.gdn_layers() > 1024) return invalid_argument(where + ": at most 1024 gdn layers");
  } else if (j.contains("gdn")) {
    return invalid_argument(where + ": field 'gdn' given but the pattern has no gdn layer");
  }
  return h;
}

Result<HybridLayout> HybridLayout::from_json_text(std::string_view text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_argument("hybrid layout: not valid JSON");
  return from_json(j);
}

json HybridLayout::to_json() const {
  json j;
  j["name"] = name_;
  j["block_size"] = attention_.block_size;
  j["dtype"] = dtype_name(attention_.layers.front().dtype);
  j["attention"] = {{"num_kv_heads", attention_.num_kv_heads}, {"head_dim", attention_.head_dim}};
  json pattern = json::array();
  for (LayerKind k : pattern_) pattern.push_back(k == LayerKind::kAttention ? "attention" : "gdn");
  j["pattern"] = pattern;
  if (gdn_layers() > 0) {
    j["gdn"] = {{"heads", gdn_.heads}, {"d_k", gdn_.d_k}, {"d_v", gdn_.d_v}, {"conv_width", gdn_.conv_width},
                {"conv_channels", gdn_.conv_channels}};
  }
  return j;
}

int HybridLayout::gdn_layers() const {
  int n = 0;
  for (LayerKind k : pattern_) n += k == LayerKind::kGatedDeltaNet;
  return n;
}

size_t HybridLayout::snapshot_bytes() const {
  return size_t(gdn_layers()) * (gdn_.state_floats() + gdn_.window_floats()) * sizeof(float);
}

uint64_t HybridLayout::fingerprint() const {
  // Canonical text, hashed with xxh3-64; its form is frozen like KvLayout's. The attention
  // layout's own fingerprint is part of it, and "hybrid" makes it differ from that one.
  std::string canon = "kvtier.hybrid.v1|A=" + attention_.fingerprint_hex() + "|P=";
  for (LayerKind k : pattern_) canon += k == LayerKind::kAttention ? 'a' : 'g';
  if (gdn_layers() > 0) {
    canon += "|G=" + std::to_string(gdn_.heads) + "," + std::to_string(gdn_.d_k) + "," + std::to_string(gdn_.d_v) +
             "," + std::to_string(gdn_.conv_width) + "," + std::to_string(gdn_.conv_channels);
  }
  return XXH3_64bits(canon.data(), canon.size());
}

std::string HybridLayout::fingerprint_hex() const {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(fingerprint()));
  return buf;
}

}  // namespace kvtier
