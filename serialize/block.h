// Block: the K and V of `block_size` tokens for every layer of one model, in host memory, with
// the identity that produced it (hash, parent hash, token ids, namespace, extra keys). A layer is
// held dense (its dtype) or affine-quantized (packed uint32 + scales + biases in its dtype).
// A Block owns its bytes in one aligned buffer; for an all-dense block the buffer is exactly the
// data section of its safetensors document (layers.0.k, layers.0.v, layers.1.k, ...).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/memory/aligned_buffer.h"
#include "base/status.h"
#include "serialize/block_hash.h"
#include "serialize/kv_layout.h"

namespace kvtier {

struct BlockIdentity {
  BlockHash hash;
  BlockHash parent_hash;                // the namespace root for the first block of a prompt
  std::vector<uint32_t> token_ids;      // exactly layout.block_size of them
  std::string namespace_id;             // the namespace the hash was computed in
  std::vector<std::string> extra_keys;  // e.g. a LoRA id; part of the hash
  bool operator==(const BlockIdentity&) const = default;
};

enum class KvPart { kK = 0, kV = 1 };

// One quantized tensor's three parts, inside the block's buffer.
template <typename Byte>
struct QuantizedParts {
  std::span<Byte> packed;  // uint32 words, as bytes
  std::span<Byte> scales;  // layer dtype
  std::span<Byte> biases;  // layer dtype
};

// Immutable once published (tiers share it through shared_ptr<const Block>); the mutable accessors
// exist for whoever fills a fresh block. Not thread-safe while being filled.
class Block {
 public:
  // Per-layer storage: nullopt = dense; a value = held quantized with these parameters.
  using LayerForms = std::vector<std::optional<Quantization>>;

  // A zero-filled block; every layer dense in the layout's dtype.
  static Block dense(std::shared_ptr<const KvLayout> layout, BlockIdentity id);
  // A dense block whose bytes are left unset, for decoders that overwrite every byte.
  static Block dense_uninitialized(std::shared_ptr<const KvLayout> layout, BlockIdentity id);
  // A dense block whose tensors are the layout's dense_block_bytes() found at `offset` in
  // `storage` (a decoded record, adopted instead of copied). The tensors are then only 8-byte
  // aligned, which every consumer of block bytes (memcpy, uploads) accepts.
  static Block adopt_dense(std::shared_ptr<const KvLayout> layout, BlockIdentity id,
                           AlignedBuffer storage, size_t offset);
  // A zero-filled block with the given per-layer forms (size must equal num_layers).
  static Result<Block> with_forms(std::shared_ptr<const KvLayout> layout, BlockIdentity id,
                                  LayerForms forms);

  const KvLayout& layout() const { return *layout_; }
  const std::shared_ptr<const KvLayout>& layout_ptr() const { return layout_; }
  const BlockIdentity& identity() const { return id_; }
  BlockIdentity& mutable_identity() { return id_; }
  const BlockHash& hash() const { return id_.hash; }

  bool is_quantized(int layer) const { return forms_[layer].has_value(); }
  bool any_quantized() const;
  const std::optional<Quantization>& form(int layer) const { return forms_[layer]; }
  // For a dense layer that was expanded from a quantized one: the quantization it came from.
  const std::optional<Quantization>& dequantized_from(int layer) const {
    return dequantized_from_[layer];
  }
  void set_dequantized_from(int layer, std::optional<Quantization> q) {
    dequantized_from_[layer] = q;
  }

  // Dense tensor [block_size, num_kv_heads, head_dim] of a dense layer.
  std::span<const uint8_t> dense_part(int layer, KvPart part) const;
  std::span<uint8_t> dense_part(int layer, KvPart part);
  QuantizedParts<const uint8_t> quantized_part(int layer, KvPart part) const;
  QuantizedParts<uint8_t> quantized_part(int layer, KvPart part);

  // Every tensor byte, in storage order.
  std::span<const uint8_t> data() const { return {base(), size_}; }
  std::span<uint8_t> mutable_data() { return {base(), size_}; }
  // Bytes this block holds in memory: its storage plus token ids (what tiers count against
  // capacity; an adopted record's frame header and padding included).
  size_t size_bytes() const { return storage_.size() + id_.token_ids.size() * sizeof(uint32_t); }

  // A dense copy: quantized layers expanded with affine_dequantize, recorded in dequantized_from.
  Block dequantized() const;
  // A copy whose dense layers are quantized with `q` (layers already quantized stay as they are).
  // Fails, changing nothing, when a value is not finite.
  Result<Block> quantized(const Quantization& q) const;
  Block clone() const;

 private:
  uint8_t* base() { return storage_.data() + offset_; }
  const uint8_t* base() const { return storage_.data() + offset_; }

  struct Slot {  // byte offsets from base()
    size_t offset = 0, bytes = 0;
    size_t scales_offset = 0, scales_bytes = 0, biases_offset = 0, biases_bytes = 0;
  };
  Block(std::shared_ptr<const KvLayout> layout, BlockIdentity id, LayerForms forms,
        bool zeroed = true, bool allocate = true);

  std::shared_ptr<const KvLayout> layout_;
  BlockIdentity id_;
  LayerForms forms_;
  std::vector<std::optional<Quantization>> dequantized_from_;
  std::vector<Slot> slots_;  // 2 per layer: K then V
  AlignedBuffer storage_;
  size_t offset_ = 0;  // where the tensors start in storage_
  size_t size_ = 0;    // tensor bytes
};

}  // namespace kvtier
