#include "serialize/format/block_document.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <unordered_map>

#include <nlohmann/json.hpp>

namespace kvtier {

using nlohmann::json;

namespace {

constexpr std::string_view kMetadataPrefix = "{\"__metadata__\":";
constexpr std::string_view kFirstTensorKey = ",\"layers.0.k\":";

std::string tensor_name(int layer, KvPart part) {
  return "layers." + std::to_string(layer) + (part == KvPart::kK ? ".k" : ".v");
}

// The tensor table as this writer emits it, from the first tensor key to the closing brace:
// ,"layers.0.k":{"dtype":"BF16","shape":[16,8,128],"data_offsets":[0,32768]},...}
// It depends only on the layout, so it is built once per layout and thread. Encoding copies it;
// decoding compares against it to skip parsing most of the header.
const std::string& canonical_tensor_table(const KvLayout& layout) {
  thread_local std::unordered_map<uint64_t, std::string> cache;
  const uint64_t fp = layout.fingerprint();
  auto it = cache.find(fp);
  if (it != cache.end()) return it->second;
  std::string table;
  const std::string shape = "[" + std::to_string(layout.block_size) + "," +
                            std::to_string(layout.num_kv_heads) + "," +
                            std::to_string(layout.head_dim) + "]";
  size_t offset = 0;
  for (int l = 0; l < layout.num_layers; ++l) {
    const size_t bytes = layout.dense_tensor_bytes(l);
    for (KvPart p : {KvPart::kK, KvPart::kV}) {
      table += ",\"" + tensor_name(l, p) + "\":{\"dtype\":\"";
      table += dtype_name(layout.layers[l].dtype);
      table += "\",\"shape\":" + shape + ",\"data_offsets\":[" + std::to_string(offset) + "," +
               std::to_string(offset + bytes) + "]}";
      offset += bytes;
    }
  }
  table += '}';
  return cache.emplace(fp, std::move(table)).first->second;
}

std::string join_tokens(const std::vector<uint32_t>& tokens) {
  std::string out;
  out.reserve(tokens.size() * 7);
  char buf[16];
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (i) out += ',';
    auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), tokens[i]);
    out.append(buf, end);
  }
  return out;
}

Status bad(const std::string& why) { return corruption("block document: " + why); }

Result<std::vector<uint32_t>> parse_tokens(std::string_view text) {
  std::vector<uint32_t> tokens;
  const char* p = text.data();
  const char* end = p + text.size();
  if (p == end) return tokens;
  while (true) {
    uint32_t v = 0;
    auto [next, ec] = std::from_chars(p, end, v);
    if (ec != std::errc() || next == p) return bad("token_ids is not a comma-separated list of u32");
    tokens.push_back(v);
    p = next;
    if (p == end) break;
    if (*p != ',') return bad("token_ids is not a comma-separated list of u32");
    ++p;
  }
  return tokens;
}

struct ParsedMetadata {
  std::shared_ptr<const KvLayout> layout;
  BlockIdentity identity;
  std::vector<std::pair<int, Quantization>> dequantized_from;
};

// __metadata__'s fields: every value is a string. Views into the header (or a parsed JSON value)
// that outlives the parse.
struct MetadataFields {
  std::vector<std::pair<std::string_view, std::string_view>> items;
  const std::string_view* find(std::string_view key) const {
    for (const auto& [k, v] : items) {
      if (k == key) return &v;
    }
    return nullptr;
  }
};

// `{"k":"v",...}` exactly as this writer emits it (no whitespace, no escapes, ASCII, distinct
// keys), split without a JSON parser: such text is one valid JSON object with exactly these string
// members, so the result equals the general parse's. nullopt for anything else (the general JSON
// parse then decides). Measured: nlohmann's lexer was ~15% of a 16 KiB block's restore.
std::optional<MetadataFields> scan_plain_metadata(std::string_view text) {
  MetadataFields out;
  if (text.size() < 2 || text.front() != '{' || text.back() != '}') return std::nullopt;
  size_t i = 1;
  auto string_at = [&](std::string_view& got) {
    if (i >= text.size() || text[i] != '"') return false;
    const size_t from = ++i;
    while (i < text.size() && text[i] != '"') {
      const auto c = static_cast<unsigned char>(text[i]);
      if (c < 0x20 || c >= 0x80 || c == '\\') return false;
      ++i;
    }
    if (i >= text.size()) return false;
    got = text.substr(from, i - from);
    ++i;  // the closing quote
    return true;
  };
  if (text.size() == 2) return out;
  while (true) {
    std::string_view key, value;
    if (!string_at(key) || i >= text.size() || text[i++] != ':' || !string_at(value)) return std::nullopt;
    if (out.find(key) != nullptr) return std::nullopt;
    out.items.emplace_back(key, value);
    if (i >= text.size()) return std::nullopt;
    const char sep = text[i++];
    if (sep == '}') return i == text.size() ? std::optional<MetadataFields>(std::move(out)) : std::nullopt;
    if (sep != ',') return std::nullopt;
  }
}

// The fields of a parsed __metadata__ object; every value must be a string.
Result<MetadataFields> json_metadata_fields(const json& meta) {
  if (!meta.is_object()) return bad("missing __metadata__ object");
  MetadataFields out;
  for (auto it = meta.begin(); it != meta.end(); ++it) {
    if (!it->is_string()) return bad("__metadata__." + it.key() + " is not a string");
    out.items.emplace_back(it.key(), it->get_ref<const std::string&>());
  }
  return out;
}

Result<BlockHash> parse_hash_field(std::string_view text, const char* key) {
  auto h = BlockHash::from_hex(text);
  if (!h.ok()) return bad(std::string(key) + ": " + h.status().message());
  return h;
}

// Checks __metadata__: every key known, each field well formed, the layout registered.
Result<ParsedMetadata> parse_metadata(const MetadataFields& meta, const LayoutRegistry& layouts) {
  static const char* kRequired[] = {"format", "hash", "parent_hash", "token_ids",
                                    "layout_fingerprint", "namespace", "extra_keys"};
  for (const auto& [key, value] : meta.items) {
    bool known = key == "dequantized_from";
    for (const char* k : kRequired) known = known || key == k;
    if (!known) return bad("unknown __metadata__ field '" + std::string(key) + "'");
  }
  for (const char* k : kRequired) {
    if (!meta.find(k)) return bad(std::string("missing __metadata__.") + k);
  }
  auto field = [&](const char* k) { return *meta.find(k); };
  if (field("format") != kBlockDocumentFormat) {
    return bad("format '" + std::string(field("format")) + "' is not " + kBlockDocumentFormat);
  }
  const std::string_view fp_text = field("layout_fingerprint");
  uint64_t fp = 0;
  auto [fp_end, fp_ec] = std::from_chars(fp_text.data(), fp_text.data() + fp_text.size(), fp, 16);
  if (fp_text.size() != 16 || fp_ec != std::errc() || fp_end != fp_text.data() + fp_text.size()) {
    return bad("layout_fingerprint is not 16 hex digits");
  }
  ParsedMetadata out;
  out.layout = layouts.find(fp);
  if (!out.layout) {
    return invalid_argument("block document: unknown layout fingerprint " + std::string(fp_text) +
                            " (register the layout first)");
  }
  const KvLayout& layout = *out.layout;
  BlockIdentity& id = out.identity;
  KVTIER_ASSIGN_OR_RETURN(id.hash, parse_hash_field(field("hash"), "hash"));
  KVTIER_ASSIGN_OR_RETURN(id.parent_hash, parse_hash_field(field("parent_hash"), "parent_hash"));
  KVTIER_ASSIGN_OR_RETURN(id.token_ids, parse_tokens(field("token_ids")));
  if (static_cast<int>(id.token_ids.size()) != layout.block_size) {
    return bad("token_ids holds " + std::to_string(id.token_ids.size()) +
               " tokens, the layout's block_size is " + std::to_string(layout.block_size));
  }
  id.namespace_id = std::string(field("namespace"));
  if (field("extra_keys") != "[]") {  // "[]": the common case, no parse needed
    const std::string_view extra_text = field("extra_keys");
    json extra = json::parse(extra_text.begin(), extra_text.end(), nullptr, false);
    if (extra.is_discarded() || !extra.is_array()) return bad("extra_keys is not a JSON array");
    for (const json& e : extra) {
      if (!e.is_string()) return bad("extra_keys holds a non-string");
      id.extra_keys.push_back(e.get<std::string>());
    }
  }
  if (const std::string_view* deq_text = meta.find("dequantized_from")) {
    json deq = json::parse(deq_text->begin(), deq_text->end(), nullptr, false);
    if (deq.is_discarded() || !deq.is_object()) return bad("dequantized_from is not a JSON object");
    for (auto it = deq.begin(); it != deq.end(); ++it) {
      int layer = -1;
      auto [e, ec] = std::from_chars(it.key().data(), it.key().data() + it.key().size(), layer);
      if (ec != std::errc() || e != it.key().data() + it.key().size() || layer < 0 ||
          layer >= layout.num_layers) {
        return bad("dequantized_from names layer '" + it.key() + "' outside the layout");
      }
      const json& q = it.value();
      if (!q.is_object() || q.size() != 2 || !q.contains("bits") || !q.contains("group_size") ||
          !q["bits"].is_number_integer() || !q["group_size"].is_number_integer()) {
        return bad("dequantized_from." + it.key() + " must be {bits, group_size}");
      }
      Quantization quant{q["bits"].get<int>(), q["group_size"].get<int>()};
      Status st = validate_quantization(quant, layout.head_dim);
      if (!st.ok()) return bad("dequantized_from." + it.key() + ": " + st.message());
      out.dequantized_from.emplace_back(layer, quant);
    }
  }
  return out;
}

Block make_block(ParsedMetadata meta) {
  Block block = Block::dense_uninitialized(meta.layout, std::move(meta.identity));
  for (const auto& [layer, q] : meta.dequantized_from) block.set_dequantized_from(layer, q);
  return block;
}

// The general path: a header from any safetensors writer, parsed and checked in full.
// Copies the data section into the block, feeding `checksum` (which has seen everything before the
// data) if given. `spans` tile the data section in offset order.
template <typename Spans, typename Dest>
void copy_data(std::span<const uint8_t> data, const Spans& spans, Dest dest, Checksum64* checksum) {
  for (const auto& s : spans) {
    uint8_t* dst = dest(s);
    if (checksum) checksum->copy_update(dst, data.data() + s.begin, s.end - s.begin);
    else std::memcpy(dst, data.data() + s.begin, s.end - s.begin);
  }
}

Result<Block> decode_general(std::string_view header, std::span<const uint8_t> data,
                             const LayoutRegistry& layouts, Checksum64* checksum) {
  json j = json::parse(header.begin(), header.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return bad("header is not valid JSON");
  if (!j.is_object()) return bad("header is not a JSON object");
  auto mit = j.find("__metadata__");
  if (mit == j.end()) return bad("missing __metadata__ object");
  KVTIER_ASSIGN_OR_RETURN(MetadataFields fields, json_metadata_fields(*mit));
  KVTIER_ASSIGN_OR_RETURN(ParsedMetadata meta, parse_metadata(fields, layouts));
  const KvLayout& layout = *meta.layout;

  // Tensors: exactly layers.{0..L-1}.{k,v}, shapes and dtypes from the layout, offsets that tile
  // the data section with no gap and no overlap.
  const size_t expected_tensors = 2 * static_cast<size_t>(layout.num_layers);
  if (j.size() != expected_tensors + 1) {
    return bad("header holds " + std::to_string(j.size() - 1) + " tensors, the layout needs " +
               std::to_string(expected_tensors));
  }
  struct Span {
    uint64_t begin, end;
    int layer;
    KvPart part;
  };
  std::vector<Span> spans;
  spans.reserve(expected_tensors);
  for (int l = 0; l < layout.num_layers; ++l) {
    for (KvPart p : {KvPart::kK, KvPart::kV}) {
      const std::string name = tensor_name(l, p);
      auto tit = j.find(name);
      if (tit == j.end()) return bad("missing tensor " + name);
      const json& t = *tit;
      if (!t.is_object() || t.size() != 3 || !t.contains("dtype") || !t.contains("shape") ||
          !t.contains("data_offsets")) {
        return bad(name + " must hold exactly dtype, shape and data_offsets");
      }
      if (!t["dtype"].is_string()) return bad(name + ".dtype is not a string");
      const std::string dt = t["dtype"].get<std::string>();
      const std::string_view want_dt = dtype_name(layout.layers[l].dtype);
      if (dt != want_dt) {
        return bad(name + " has dtype " + dt + ", the layout says " + std::string(want_dt));
      }
      const json& shape = t["shape"];
      const int64_t want_shape[3] = {layout.block_size, layout.num_kv_heads, layout.head_dim};
      bool shape_ok = shape.is_array() && shape.size() == 3;
      for (size_t d = 0; shape_ok && d < 3; ++d) {
        shape_ok = shape[d].is_number_integer() && shape[d].get<int64_t>() == want_shape[d];
      }
      if (!shape_ok) {
        return bad(name + " has shape " + shape.dump() + ", the layout needs [" +
                   std::to_string(want_shape[0]) + "," + std::to_string(want_shape[1]) + "," +
                   std::to_string(want_shape[2]) + "]");
      }
      const json& offs = t["data_offsets"];
      if (!offs.is_array() || offs.size() != 2 || !offs[0].is_number_unsigned() ||
          !offs[1].is_number_unsigned()) {
        return bad(name + ".data_offsets must be two non-negative integers");
      }
      const uint64_t b = offs[0].get<uint64_t>(), e = offs[1].get<uint64_t>();
      if (b > e || e > data.size()) {
        return bad(name + ".data_offsets [" + std::to_string(b) + "," + std::to_string(e) +
                   ") fall outside the " + std::to_string(data.size()) + "-byte data section");
      }
      if (e - b != layout.dense_tensor_bytes(l)) {
        return bad(name + " spans " + std::to_string(e - b) + " bytes, its shape needs " +
                   std::to_string(layout.dense_tensor_bytes(l)));
      }
      spans.push_back({b, e, l, p});
    }
  }
  std::sort(spans.begin(), spans.end(),
            [](const Span& a, const Span& b) { return a.begin < b.begin; });
  uint64_t cursor = 0;
  for (const Span& s : spans) {
    if (s.begin < cursor) return bad("tensor " + tensor_name(s.layer, s.part) + " overlaps another");
    if (s.begin > cursor) return bad("data section has a gap before " + tensor_name(s.layer, s.part));
    cursor = s.end;
  }
  if (cursor != data.size()) {
    return bad("data section has " + std::to_string(data.size() - cursor) +
               " trailing bytes no tensor covers");
  }
  Block block = make_block(std::move(meta));
  copy_data(data, spans, [&](const Span& s) { return block.dense_part(s.layer, s.part).data(); },
            checksum);
  return block;
}

// The fast path for headers in this writer's own form: `{"__metadata__":` M T, where T is the
// layout's canonical tensor table (plus padding). Only M is parsed; T is compared byte for byte.
// This accepts exactly what decode_general accepts for such headers: M parsed alone is one
// complete JSON value, so the whole header is valid JSON with the same content. The first
// `,"layers.0.k":` in the header is T's start, because a '"' inside a JSON string is escaped.
// Returns nullopt when the header is not in that form (the general path then decides); a match
// means the data section is exactly the block's tensors in storage order.
std::optional<Result<ParsedMetadata>> match_canonical(std::string_view header, size_t data_size,
                                                      const LayoutRegistry& layouts) {
  if (header.substr(0, kMetadataPrefix.size()) != kMetadataPrefix) return std::nullopt;
  const size_t table_at = header.find(kFirstTensorKey);
  if (table_at == std::string_view::npos) return std::nullopt;
  const std::string_view meta_text =
      header.substr(kMetadataPrefix.size(), table_at - kMetadataPrefix.size());
  json meta;  // the general JSON parse, only when the plain scan does not apply
  std::optional<MetadataFields> fields = scan_plain_metadata(meta_text);
  if (!fields) {
    meta = json::parse(meta_text.begin(), meta_text.end(), nullptr, false);
    if (meta.is_discarded() || !meta.is_object()) return std::nullopt;
    auto from_json = json_metadata_fields(meta);
    if (!from_json.ok()) return Result<ParsedMetadata>(from_json.status());
    fields = std::move(from_json).value();
  }
  auto parsed = parse_metadata(*fields, layouts);
  if (!parsed.ok()) return Result<ParsedMetadata>(parsed.status());
  std::string_view table = header.substr(table_at);
  while (!table.empty() && (table.back() == ' ' || table.back() == '\n' || table.back() == '\t' ||
                            table.back() == '\r')) {
    table.remove_suffix(1);
  }
  const KvLayout& layout = *parsed->layout;
  if (table != canonical_tensor_table(layout)) return std::nullopt;
  // A data section of the wrong size gets the general path's precise message.
  if (data_size != layout.dense_block_bytes()) return std::nullopt;
  return parsed;
}

// Splits a document into its header and data section.
Result<std::pair<std::string_view, std::span<const uint8_t>>> split_document(
    std::span<const uint8_t> doc) {
  if (doc.size() < 8) return bad("truncated: " + std::to_string(doc.size()) + " bytes");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(doc[i]) << (8 * i);
  if (n == 0 || n > kMaxDocumentHeaderBytes || n > doc.size() - 8) {
    return bad("header length " + std::to_string(n) + " does not fit in " +
               std::to_string(doc.size()) + " bytes");
  }
  return std::make_pair(std::string_view(reinterpret_cast<const char*>(doc.data() + 8), n),
                        doc.subspan(8 + n));
}

}  // namespace

Result<std::string> block_document_header(const Block& block) {
  if (block.any_quantized()) {
    return invalid_argument("block document: quantized layers must be dequantized before encoding");
  }
  const KvLayout& layout = block.layout();
  const BlockIdentity& id = block.identity();
  json meta = json::object();
  meta["format"] = kBlockDocumentFormat;
  meta["hash"] = id.hash.hex();
  meta["parent_hash"] = id.parent_hash.hex();
  meta["token_ids"] = join_tokens(id.token_ids);
  meta["layout_fingerprint"] = layout.fingerprint_hex();
  meta["namespace"] = id.namespace_id;
  meta["extra_keys"] = json(id.extra_keys).dump();
  json deq = json::object();
  for (int l = 0; l < layout.num_layers; ++l) {
    if (const auto& q = block.dequantized_from(l)) {
      deq[std::to_string(l)] = {{"bits", q->bits}, {"group_size", q->group_size}};
    }
  }
  if (!deq.empty()) meta["dequantized_from"] = deq.dump();

  std::string header(kMetadataPrefix);
  header += meta.dump();
  header += canonical_tensor_table(layout);
  header.resize(align_up(header.size(), 8), ' ');
  return header;
}

void write_block_document(const Block& block, const std::string& header, uint8_t* dst,
                          Checksum64* checksum) {
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) dst[i] = static_cast<uint8_t>(n >> (8 * i));
  std::memcpy(dst + 8, header.data(), header.size());
  // An all-dense block's buffer is laid out exactly like the data section.
  const auto data = block.data();
  if (checksum) {
    checksum->update(dst, 8 + header.size());
    checksum->copy_update(dst + 8 + header.size(), data.data(), data.size());
  } else {
    std::memcpy(dst + 8 + header.size(), data.data(), data.size());
  }
}

Status encode_block_document(const Block& block, Bytes& out) {
  KVTIER_ASSIGN_OR_RETURN(std::string header, block_document_header(block));
  const size_t start = out.size();
  out.resize(start + block_document_size(block, header));
  write_block_document(block, header, out.data() + start, nullptr);
  return ok_status();
}

Result<Block> decode_block_document(std::span<const uint8_t> doc, const LayoutRegistry& layouts,
                                    Checksum64* checksum) {
  KVTIER_ASSIGN_OR_RETURN(auto parts, split_document(doc));
  const auto [header, data] = parts;
  if (checksum) checksum->update(doc.data(), 8 + header.size());
  if (auto match = match_canonical(header, data.size(), layouts)) {
    if (!match->ok()) return match->status();
    Block block = make_block(std::move(*match).value());
    // The canonical table lists tensors in the block's own storage order, without gaps.
    struct Whole {
      uint64_t begin, end;
    };
    const Whole all[] = {{0, data.size()}};
    copy_data(data, all, [&](const Whole&) { return block.mutable_data().data(); }, checksum);
    return block;
  }
  return decode_general(header, data, layouts, checksum);
}

Result<Block> decode_block_document_adopting(AlignedBuffer storage, size_t offset, size_t length,
                                             const LayoutRegistry& layouts) {
  const std::span<const uint8_t> doc(storage.data() + offset, length);
  KVTIER_ASSIGN_OR_RETURN(auto parts, split_document(doc));
  const auto [header, data] = parts;
  if (auto match = match_canonical(header, data.size(), layouts)) {
    if (!match->ok()) return match->status();
    ParsedMetadata meta = std::move(*match).value();
    const size_t data_offset = offset + 8 + header.size();
    Block block = Block::adopt_dense(meta.layout, std::move(meta.identity), std::move(storage),
                                     data_offset);
    for (const auto& [layer, q] : meta.dequantized_from) block.set_dequantized_from(layer, q);
    return block;
  }
  return decode_general(header, data, layouts, nullptr);
}

}  // namespace kvtier
