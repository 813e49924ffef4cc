#include "serialize/format/state_document.h"

#include <cstring>

#include <nlohmann/json.hpp>

namespace kvtier {
namespace {

using nlohmann::json;

Status bad(const std::string& why) { return corruption("state document: " + why); }

struct Tensor {
  std::string name;
  std::vector<int64_t> shape;
  size_t bytes = 0;
};

// The tensors a snapshot of `layout` holds, in data order.
std::vector<Tensor> tensors_of(const HybridLayout& layout) {
  const GdnSpec& g = layout.gdn();
  std::vector<Tensor> out;
  for (size_t i = 0; i < layout.pattern().size(); ++i) {
    if (layout.pattern()[i] != LayerKind::kGatedDeltaNet) continue;
    const std::string layer = "layers." + std::to_string(i);
    out.push_back({layer + ".state", {g.heads, g.d_k, g.d_v}, g.state_floats() * 4});
    out.push_back({layer + ".conv_window", {g.conv_channels, g.conv_width - 1}, g.window_floats() * 4});
  }
  return out;
}

}  // namespace

Status encode_state_document(const HybridLayout& layout, const StateSnapshot& s, Bytes& out) {
  if (s.data.size() != layout.snapshot_bytes()) {
    return invalid_argument("state document: the snapshot holds " + std::to_string(s.data.size()) +
                            " bytes, the layout's snapshots " + std::to_string(layout.snapshot_bytes()));
  }
  json header = json::object();
  header["__metadata__"] = {{"format", kStateDocumentFormat},
                            {"hash", s.at.hex()},
                            {"tokens", std::to_string(s.tokens)},
                            {"layout_fingerprint", layout.fingerprint_hex()},
                            {"namespace", s.ns}};
  size_t offset = 0;
  for (const Tensor& t : tensors_of(layout)) {
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes}}};
    offset += t.bytes;
  }
  std::string text = header.dump();
  text.resize(align_up(text.size(), 8), ' ');
  const size_t start = out.size();
  out.resize(start + 8 + text.size() + s.data.size());
  uint8_t* dst = out.data() + start;
  for (int i = 0; i < 8; ++i) dst[i] = static_cast<uint8_t>(uint64_t{text.size()} >> (8 * i));
  std::memcpy(dst + 8, text.data(), text.size());
  std::memcpy(dst + 8 + text.size(), s.data.data(), s.data.size());
  return ok_status();
}

Result<StateSnapshot> decode_state_document(std::span<const uint8_t> doc, const HybridLayout& layout) {
  if (doc.size() < 8) return bad("truncated: " + std::to_string(doc.size()) + " bytes");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(doc[i]) << (8 * i);
  if (n == 0 || n > doc.size() - 8) {
    return bad("header length " + std::to_string(n) + " does not fit in " + std::to_string(doc.size()) + " bytes");
  }
  const json header = json::parse(doc.begin() + 8, doc.begin() + 8 + n, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) return bad("the header is not a JSON object");
  const std::span<const uint8_t> data = doc.subspan(8 + n);
  if (!header.contains("__metadata__") || !header["__metadata__"].is_object()) return bad("no __metadata__");
  const json& meta = header["__metadata__"];
  for (const char* key : {"format", "hash", "tokens", "layout_fingerprint", "namespace"}) {
    if (!meta.contains(key) || !meta[key].is_string()) return bad(std::string("metadata '") + key + "' missing or not a string");
  }
  if (meta["format"] != kStateDocumentFormat) return bad("format " + meta["format"].dump());
  if (meta["layout_fingerprint"] != layout.fingerprint_hex()) {
    return bad("layout fingerprint " + meta["layout_fingerprint"].get<std::string>() + ", expected " +
               layout.fingerprint_hex());
  }
  StateSnapshot s;
  auto hash = BlockHash::from_hex(meta["hash"].get<std::string>());
  if (!hash.ok()) return bad("hash: " + hash.status().message());
  s.at = *hash;
  const std::string tokens = meta["tokens"].get<std::string>();
  if (tokens.empty() || tokens.size() > 19 || tokens.find_first_not_of("0123456789") != std::string::npos) {
    return bad("tokens '" + tokens + "' is not a decimal count");
  }
  s.tokens = std::stoull(tokens);
  s.ns = meta["namespace"].get<std::string>();
  const std::vector<Tensor> expected = tensors_of(layout);
  if (header.size() != expected.size() + 1) {
    return bad(std::to_string(header.size() - 1) + " tensors, the layout's snapshots hold " +
               std::to_string(expected.size()));
  }
  size_t offset = 0;
  for (const Tensor& t : expected) {
    if (!header.contains(t.name)) return bad("no tensor " + t.name);
    const json& e = header[t.name];
    if (!e.is_object() || e.value("dtype", json()) != "F32" || e.value("shape", json()) != json(t.shape) ||
        e.value("data_offsets", json()) != json({offset, offset + t.bytes})) {
      return bad("tensor " + t.name + ": " + e.dump() + ", expected F32 " + json(t.shape).dump() + " at [" +
                 std::to_string(offset) + ", " + std::to_string(offset + t.bytes) + ")");
    }
    offset += t.bytes;
  }
  if (data.size() != offset) {
    return bad("data of " + std::to_string(data.size()) + " bytes, the tensors cover " + std::to_string(offset));
  }
  s.data = AlignedBuffer(data.size(), AlignedBuffer::kDefaultAlignment, /*zeroed=*/false);
  std::memcpy(s.data.data(), data.data(), data.size());
  return s;
}

}  // namespace kvtier
