#include "tests/server/wire_blocks.h"

#include <fstream>

#include <nlohmann/json.hpp>

#include "cache/prefix_hasher.h"
#include "serialize/format/block_codec.h"

namespace kvtier::testing {

std::vector<uint32_t> prompt(uint32_t seed, size_t n) {
  std::vector<uint32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = (seed * 7919u + static_cast<uint32_t>(i) * 104729u) % 151936u;
  return t;
}

std::vector<WireBlock> prompt_blocks(std::shared_ptr<const KvLayout> layout, const std::string& ns,
                                     const std::vector<uint32_t>& tokens, Values values) {
  PrefixHasher hasher(HashAlgorithm::kSha256, Namespace{ns, layout->fingerprint(), ""}, layout->block_size);
  const auto keys = hasher.keys(tokens, {});
  std::vector<WireBlock> out;
  for (size_t i = 0; i < keys.size(); ++i) {
    Block b = Block::dense(layout, hasher.identity(keys, i, {}));
    std::mt19937_64 rng(keys[i].hash.bytes[0] * 131 + i);
    for (int l = 0; l < layout->num_layers; ++l) {
      for (KvPart p : {KvPart::kK, KvPart::kV}) {
        fill_tensor(layout->layers[l].dtype, b.dense_part(l, p), rng, values, layout->head_dim);
      }
    }
    WireBlock w{keys[i].hash, {}};
    if (!BlockCodec::encode_document(b, w.document).ok()) std::abort();
    out.push_back(std::move(w));
  }
  return out;
}

std::shared_ptr<const KvLayout> tiny_layout(DType dtype) {
  KvLayout l = layout_preset("tiny").value();
  for (auto& layer : l.layers) layer.dtype = dtype;
  l.name = "tiny-" + std::string(dtype_name(dtype));
  return std::make_shared<const KvLayout>(std::move(l));
}

std::string write_layout_file(const std::string& dir, DType dtype) {
  const std::string path = dir + "/layout-" + std::string(dtype_name(dtype)) + ".json";
  std::ofstream(path) << tiny_layout(dtype)->to_json().dump(2);
  return path;
}

}  // namespace kvtier::testing
