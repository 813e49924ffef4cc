#include "serialize/state_record.h"

#include <algorithm>
#include <cstring>

namespace kvtier {
namespace {

size_t layer_floats(const HybridLayout& h) { return h.gdn().state_floats() + h.gdn().window_floats(); }

std::string hybrid_tag(const HybridLayout& h) { return "hybrid=" + h.fingerprint_hex(); }

}  // namespace

KvLayout snapshot_layout(const HybridLayout& hybrid) {
  const int block_size = hybrid.attention().block_size;
  // K and V of one layer hold 2 * block_size * heads * head_dim floats, head_dim a multiple of 8
  // and at most KvLayout's 1024: a real model's state (16 heads of 128 x 128 and a 6144-channel
  // window, 280k floats) needs several "heads". One head where one is enough, which keeps the
  // layout (and so the records) of small hybrids as they were.
  const size_t per_row = 2 * static_cast<size_t>(block_size);
  const size_t row_floats = (layer_floats(hybrid) + per_row - 1) / per_row;
  constexpr size_t kMaxHeadDim = 1024;
  const size_t heads = (row_floats + kMaxHeadDim - 1) / kMaxHeadDim;
  size_t head_dim = (row_floats + heads - 1) / heads;
  head_dim = (head_dim + 7) / 8 * 8;
  return KvLayout::uniform(hybrid.name() + ".state", std::max(1, hybrid.gdn_layers()), static_cast<int>(heads),
                           static_cast<int>(head_dim), block_size, DType::kF32);
}

bool is_state_record(const Block& block) {
  const auto& keys = block.identity().extra_keys;
  return !keys.empty() && keys.front() == kStateRecordTag;
}

Result<Block> make_state_record(const HybridLayout& hybrid, std::shared_ptr<const KvLayout> layout,
                                const BlockIdentity& kv, const BlockHash& key, uint64_t prefix_tokens,
                                std::span<const uint8_t> snapshot) {
  if (snapshot.size() != hybrid.snapshot_bytes()) {
    return invalid_argument("state record: a snapshot of " + std::to_string(snapshot.size()) + " bytes; " +
                            hybrid.name() + "'s is " + std::to_string(hybrid.snapshot_bytes()));
  }
  if (!layout || *layout != snapshot_layout(hybrid)) {
    return invalid_argument("state record: the layout is not " + hybrid.name() + "'s snapshot layout");
  }
  BlockIdentity id;
  id.hash = key;
  id.parent_hash = kv.hash;
  id.token_ids = kv.token_ids;
  id.namespace_id = kv.namespace_id;
  id.extra_keys = {kStateRecordTag, hybrid_tag(hybrid), "tokens=" + std::to_string(prefix_tokens)};
  id.extra_keys.insert(id.extra_keys.end(), kv.extra_keys.begin(), kv.extra_keys.end());
  Block record = Block::dense(std::move(layout), std::move(id));  // zeroed: the padding stays 0
  const size_t layer_bytes = layer_floats(hybrid) * sizeof(float);
  const size_t stride = 2 * record.layout().dense_tensor_bytes(0);
  std::span<uint8_t> out = record.mutable_data();
  for (int j = 0; j < hybrid.gdn_layers(); ++j) {
    std::memcpy(out.data() + j * stride, snapshot.data() + j * layer_bytes, layer_bytes);
  }
  return record;
}

Result<uint64_t> prefix_tokens_of(const Block& record) {
  const auto& keys = record.identity().extra_keys;
  if (!is_state_record(record) || keys.size() < 3 || keys[2].rfind("tokens=", 0) != 0) {
    return corruption("state record " + record.hash().hex() + " does not say how long its prefix is");
  }
  try {
    size_t used = 0;
    const uint64_t n = std::stoull(keys[2].substr(7), &used);
    if (used + 7 == keys[2].size()) return n;
  } catch (const std::exception&) {
  }
  return corruption("state record " + record.hash().hex() + ": bad prefix length '" + keys[2] + "'");
}

std::vector<std::string> block_extra_keys_of(const Block& record) {
  const auto& keys = record.identity().extra_keys;
  return keys.size() > 3 ? std::vector<std::string>(keys.begin() + 3, keys.end()) : std::vector<std::string>();
}

Result<AlignedBuffer> snapshot_of(const HybridLayout& hybrid, const Block& record) {
  const auto bad = [&](const std::string& why) { return corruption("state record " + record.hash().hex() + ": " + why); };
  if (!is_state_record(record) || record.identity().extra_keys.size() < 2 ||
      record.identity().extra_keys[1] != hybrid_tag(hybrid)) {
    return bad("not a state record of " + hybrid.name());
  }
  if (record.layout() != snapshot_layout(hybrid) || record.any_quantized()) {
    return bad("its layout is not " + hybrid.name() + "'s snapshot layout");
  }
  const size_t layer_bytes = layer_floats(hybrid) * sizeof(float);
  const size_t stride = 2 * record.layout().dense_tensor_bytes(0);
  std::span<const uint8_t> in = record.data();
  AlignedBuffer out(hybrid.snapshot_bytes(), AlignedBuffer::kDefaultAlignment, false);
  for (int j = 0; j < hybrid.gdn_layers(); ++j) {
    const uint8_t* layer = in.data() + j * stride;
    std::memcpy(out.data() + j * layer_bytes, layer, layer_bytes);
    if (std::any_of(layer + layer_bytes, layer + stride, [](uint8_t b) { return b != 0; })) {
      return bad("non-zero bytes past GDN layer " + std::to_string(j) + "'s state");
    }
  }
  return out;
}

}  // namespace kvtier
