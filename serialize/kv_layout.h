// KvLayout: the shape of one model's KV cache — layers, KV heads, head dim, tokens per block, and
// per layer the dtype and optional affine quantization. Every size in kvtier is computed from it;
// nothing assumes fp16. Its fingerprint (a stable 64-bit hash of the shape, not the name) goes
// into every block hash and every stored block, so two layouts never share a block.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "base/status.h"
#include "serialize/dtype.h"

namespace kvtier {

// MLX-style affine group quantization: every `group_size` consecutive values along head_dim share
// one scale and one bias (w ~= scale * q + bias), q packed into uint32 words.
struct Quantization {
  int bits = 8;         // 4 or 8
  int group_size = 64;  // 32, 64 or 128
  bool operator==(const Quantization&) const = default;
};
Status validate_quantization(const Quantization& q, int head_dim);

struct LayerSpec {
  DType dtype = DType::kBF16;               // F32, F16 or BF16
  std::optional<Quantization> quantization;  // set when the engine keeps this layer quantized
  bool operator==(const LayerSpec&) const = default;
};

struct KvLayout {
  std::string name;  // cosmetic; not part of the fingerprint
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 16;  // tokens per block
  std::vector<LayerSpec> layers;

  bool operator==(const KvLayout&) const = default;

  // Elements in one block's K (or V) of one layer: block_size * num_kv_heads * head_dim.
  size_t elements_per_tensor() const {
    return static_cast<size_t>(block_size) * num_kv_heads * head_dim;
  }
  // Bytes of one layer's dense K (or V) in one block.
  size_t dense_tensor_bytes(int layer) const {
    return elements_per_tensor() * dtype_size(layers[layer].dtype);
  }
  // Bytes of one dense block (K and V, all layers).
  size_t dense_block_bytes() const;

  // Checks ranges and consistency: at least one layer, head_dim a multiple of 8 (the shaders load
  // 8 elements at a time) and of every group_size, kv dtypes only, bits 4/8, groups 32/64/128.
  Status validate() const;
  // Stable across versions and machines; independent of `name` and of JSON formatting.
  uint64_t fingerprint() const;
  std::string fingerprint_hex() const;

  // JSON form:
  //   {"name": "llama-3-8b", "num_layers": 32, "num_kv_heads": 8, "head_dim": 128,
  //    "block_size": 16, "dtype": "BF16",
  //    "layers": [{"dtype": "F16", "quantization": {"bits": 4, "group_size": 64}}, ...]}
  // "dtype" applies to every layer; "layers" (optional, one entry per layer) overrides it.
  // Unknown keys are errors (a typo must not silently become a default).
  nlohmann::json to_json() const;
  static Result<KvLayout> from_json(const nlohmann::json& j);
  static Result<KvLayout> from_json_text(std::string_view text);
  static Result<KvLayout> load_file(const std::string& path);

  // Uniform layout: every layer `dtype`, unquantized.
  static KvLayout uniform(std::string name, int num_layers, int num_kv_heads, int head_dim,
                          int block_size, DType dtype);
};

// Presets: "qwen3-0.6b", "llama-3-8b", "tiny" (2 layers, 2 kv heads, head_dim 64, for tests).
Result<KvLayout> layout_preset(std::string_view name);
std::vector<std::string> layout_preset_names();
// A preset name or a path to a JSON file.
Result<KvLayout> resolve_layout(std::string_view preset_or_path);

}  // namespace kvtier
