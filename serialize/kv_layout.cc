#include "serialize/kv_layout.h"

#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>
#include <xxhash.h>

namespace kvtier {

using nlohmann::json;

Status validate_quantization(const Quantization& q, int head_dim) {
  if (q.bits != 4 && q.bits != 8) {
    return invalid_argument("quantization bits must be 4 or 8, got " + std::to_string(q.bits));
  }
  if (q.group_size != 32 && q.group_size != 64 && q.group_size != 128) {
    return invalid_argument("quantization group_size must be 32, 64 or 128, got " +
                            std::to_string(q.group_size));
  }
  if (head_dim % q.group_size != 0) {
    return invalid_argument("head_dim " + std::to_string(head_dim) +
                            " is not a multiple of quantization group_size " +
                            std::to_string(q.group_size));
  }
  return ok_status();
}

size_t KvLayout::dense_block_bytes() const {
  size_t total = 0;
  for (int l = 0; l < num_layers; ++l) total += 2 * dense_tensor_bytes(l);
  return total;
}

Status KvLayout::validate() const {
  auto range = [](const char* what, int v, int lo, int hi) -> Status {
    if (v < lo || v > hi) {
      return invalid_argument(std::string(what) + " must be in [" + std::to_string(lo) + ", " +
                              std::to_string(hi) + "], got " + std::to_string(v));
    }
    return ok_status();
  };
  KVTIER_RETURN_IF_ERROR(range("num_layers", num_layers, 1, 1024));
  KVTIER_RETURN_IF_ERROR(range("num_kv_heads", num_kv_heads, 1, 1024));
  KVTIER_RETURN_IF_ERROR(range("head_dim", head_dim, 8, 1024));
  KVTIER_RETURN_IF_ERROR(range("block_size", block_size, 1, 1024));
  if (head_dim % 8 != 0) {
    return invalid_argument("head_dim must be a multiple of 8, got " + std::to_string(head_dim));
  }
  if (static_cast<int>(layers.size()) != num_layers) {
    return invalid_argument("layout has " + std::to_string(layers.size()) +
                            " layer specs for num_layers " + std::to_string(num_layers));
  }
  for (int l = 0; l < num_layers; ++l) {
    const LayerSpec& s = layers[l];
    if (!is_kv_dtype(s.dtype)) {
      return invalid_argument("layer " + std::to_string(l) + ": dtype " +
                              std::string(dtype_name(s.dtype)) + " is not F32, F16 or BF16");
    }
    if (s.quantization) {
      KVTIER_RETURN_IF_ERROR(
          validate_quantization(*s.quantization, head_dim).with_context("layer " + std::to_string(l)));
    }
  }
  return ok_status();
}

uint64_t KvLayout::fingerprint() const {
  // Canonical text, hashed with xxh3-64. The text's form is frozen: changing it changes every
  // stored block's identity. Name is excluded (renaming a preset must not orphan the cache).
  std::string canon = "kvtier.layout.v1|L=" + std::to_string(num_layers) +
                      "|H=" + std::to_string(num_kv_heads) + "|D=" + std::to_string(head_dim) +
                      "|B=" + std::to_string(block_size);
  for (const LayerSpec& s : layers) {
    canon += '|';
    canon += dtype_name(s.dtype);
    if (s.quantization) {
      canon += ",q" + std::to_string(s.quantization->bits) + "g" +
               std::to_string(s.quantization->group_size);
    }
  }
  return XXH3_64bits(canon.data(), canon.size());
}

std::string KvLayout::fingerprint_hex() const {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(fingerprint()));
  return buf;
}

json KvLayout::to_json() const {
  json j;
  j["name"] = name;
  j["num_layers"] = num_layers;
  j["num_kv_heads"] = num_kv_heads;
  j["head_dim"] = head_dim;
  j["block_size"] = block_size;
  json ls = json::array();
  for (const LayerSpec& s : layers) {
    json lj;
    lj["dtype"] = std::string(dtype_name(s.dtype));
    if (s.quantization) {
      lj["quantization"] = {{"bits", s.quantization->bits},
                            {"group_size", s.quantization->group_size}};
    }
    ls.push_back(std::move(lj));
  }
  j["layers"] = std::move(ls);
  return j;
}

namespace {

Status check_keys(const json& j, const std::set<std::string>& allowed, const std::string& where) {
  if (!j.is_object()) return invalid_argument(where + ": expected a JSON object");
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!allowed.count(it.key())) {
      return invalid_argument(where + ": unknown field '" + it.key() + "'");
    }
  }
  return ok_status();
}

Result<int> get_int(const json& j, const char* key, const std::string& where,
                    std::optional<int> fallback = std::nullopt) {
  auto it = j.find(key);
  if (it == j.end()) {
    if (fallback) return *fallback;
    return invalid_argument(where + ": missing field '" + key + "'");
  }
  if (!it->is_number_integer()) {
    return invalid_argument(where + ": field '" + key + "' must be an integer, got " +
                            it->type_name());
  }
  int64_t v = it->get<int64_t>();
  if (v < INT32_MIN || v > INT32_MAX) {
    return invalid_argument(where + ": field '" + key + "' is out of range");
  }
  return static_cast<int>(v);
}

Result<DType> get_dtype(const json& j, const std::string& where) {
  if (!j.is_string()) return invalid_argument(where + ": dtype must be a string");
  return parse_dtype(j.get<std::string>());
}

Result<LayerSpec> parse_layer(const json& j, DType fallback, const std::string& where) {
  KVTIER_RETURN_IF_ERROR(check_keys(j, {"dtype", "quantization"}, where));
  LayerSpec spec;
  spec.dtype = fallback;
  if (j.contains("dtype")) {
    KVTIER_ASSIGN_OR_RETURN(spec.dtype, get_dtype(j["dtype"], where));
  }
  if (j.contains("quantization") && !j["quantization"].is_null()) {
    const json& q = j["quantization"];
    std::string qwhere = where + ".quantization";
    KVTIER_RETURN_IF_ERROR(check_keys(q, {"bits", "group_size"}, qwhere));
    Quantization quant;
    KVTIER_ASSIGN_OR_RETURN(quant.bits, get_int(q, "bits", qwhere));
    KVTIER_ASSIGN_OR_RETURN(quant.group_size, get_int(q, "group_size", qwhere));
    spec.quantization = quant;
  }
  return spec;
}

}  // namespace

Result<KvLayout> KvLayout::from_json(const json& j) {
  const std::string where = "layout";
  KVTIER_RETURN_IF_ERROR(check_keys(
      j, {"name", "num_layers", "num_kv_heads", "head_dim", "block_size", "dtype", "layers"},
      where));
  KvLayout layout;
  if (j.contains("name")) {
    if (!j["name"].is_string()) return invalid_argument("layout: field 'name' must be a string");
    layout.name = j["name"].get<std::string>();
  }
  KVTIER_ASSIGN_OR_RETURN(layout.num_layers, get_int(j, "num_layers", where));
  KVTIER_ASSIGN_OR_RETURN(layout.num_kv_heads, get_int(j, "num_kv_heads", where));
  KVTIER_ASSIGN_OR_RETURN(layout.head_dim, get_int(j, "head_dim", where));
  KVTIER_ASSIGN_OR_RETURN(layout.block_size, get_int(j, "block_size", where, 16));
  if (layout.num_layers < 1 || layout.num_layers > 1024) {
    return invalid_argument("layout: num_layers must be in [1, 1024], got " +
                            std::to_string(layout.num_layers));
  }
  std::optional<DType> all_dtype;
  if (j.contains("dtype")) {
    KVTIER_ASSIGN_OR_RETURN(all_dtype, get_dtype(j["dtype"], where));
  }
  if (j.contains("layers")) {
    const json& ls = j["layers"];
    if (!ls.is_array()) return invalid_argument("layout: field 'layers' must be an array");
    if (static_cast<int>(ls.size()) != layout.num_layers) {
      return invalid_argument("layout: 'layers' has " + std::to_string(ls.size()) +
                              " entries for num_layers " + std::to_string(layout.num_layers));
    }
    for (size_t i = 0; i < ls.size(); ++i) {
      if (!all_dtype && !ls[i].contains("dtype")) {
        return invalid_argument("layout.layers[" + std::to_string(i) +
                                "]: missing field 'dtype' (and no layout-wide 'dtype')");
      }
      KVTIER_ASSIGN_OR_RETURN(
          LayerSpec spec,
          parse_layer(ls[i], all_dtype.value_or(DType::kBF16), "layout.layers[" + std::to_string(i) + "]"));
      layout.layers.push_back(spec);
    }
  } else {
    if (!all_dtype) return invalid_argument("layout: missing field 'dtype' (or 'layers')");
    layout.layers.assign(layout.num_layers, LayerSpec{*all_dtype, std::nullopt});
  }
  KVTIER_RETURN_IF_ERROR(layout.validate());
  return layout;
}

Result<KvLayout> KvLayout::from_json_text(std::string_view text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_argument("layout: not valid JSON");
  return from_json(j);
}

Result<KvLayout> KvLayout::load_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return not_found("layout file '" + path + "' cannot be opened");
  std::stringstream ss;
  ss << in.rdbuf();
  auto r = from_json_text(ss.str());
  if (!r.ok()) return r.status().with_context(path);
  return r;
}

KvLayout KvLayout::uniform(std::string name, int num_layers, int num_kv_heads, int head_dim,
                           int block_size, DType dtype) {
  KvLayout l;
  l.name = std::move(name);
  l.num_layers = num_layers;
  l.num_kv_heads = num_kv_heads;
  l.head_dim = head_dim;
  l.block_size = block_size;
  l.layers.assign(num_layers, LayerSpec{dtype, std::nullopt});
  return l;
}

}  // namespace kvtier
