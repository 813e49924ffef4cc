// HybridLayout: the shape of a hybrid model's cache — which layers are attention and
// which Gated DeltaNet, the attention layers' KV layout, and what a GDN layer's recurrent state and
// conv window hold. The KV blocks of a hybrid model are those of `attention()` (a KvLayout over the
// attention layers alone); a prefix is restored only together with a state snapshot of every GDN
// layer taken at its end, whose size `snapshot_bytes()` gives. The fingerprint names the whole
// hybrid shape, so a hybrid model never shares blocks with a plain one of the same attention shape.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "base/status.h"
#include "serialize/kv_layout.h"

namespace kvtier {

enum class LayerKind { kAttention, kGatedDeltaNet };

// One GDN layer's state: per head a d_k x d_v f32 matrix, plus the causal conv's window of the last
// conv_width - 1 inputs over conv_channels channels (the q, k, v projections it convolves).
struct GdnSpec {
  int heads = 0;
  int d_k = 0;
  int d_v = 0;
  int conv_width = 4;
  int conv_channels = 0;
  bool operator==(const GdnSpec&) const = default;

  size_t state_floats() const { return size_t(heads) * d_k * d_v; }
  size_t window_floats() const { return size_t(conv_channels) * (conv_width - 1); }
};

class HybridLayout {
 public:
  // JSON form:
  //   {"name": "tiny-hybrid", "block_size": 16, "dtype": "BF16",
  //    "attention": {"num_kv_heads": 2, "head_dim": 64},
  //    "gdn": {"heads": 4, "d_k": 64, "d_v": 64, "conv_width": 4, "conv_channels": 768},
  //    "pattern": ["gdn", "gdn", "gdn", "attention", ...]}   one entry per layer, in order
  // Unknown keys are errors. At least one attention layer; "gdn" required when the pattern has one.
  static Result<HybridLayout> from_json(const nlohmann::json& j);
  static Result<HybridLayout> from_json_text(std::string_view text);
  nlohmann::json to_json() const;

  const std::string& name() const { return name_; }
  const std::vector<LayerKind>& pattern() const { return pattern_; }
  // The KV layout of the attention layers alone, in order (its num_layers counts only them).
  const KvLayout& attention() const { return attention_; }
  const GdnSpec& gdn() const { return gdn_; }
  int gdn_layers() const;
  // Bytes of one snapshot: every GDN layer's state and conv window, f32.
  size_t snapshot_bytes() const;
  // Stable across versions and machines; independent of the name; differs from attention()'s.
  uint64_t fingerprint() const;
  std::string fingerprint_hex() const;  // 16 hex digits, as documents write it

  bool operator==(const HybridLayout&) const = default;

 private:
  std::string name_;
  std::vector<LayerKind> pattern_;
  KvLayout attention_;
  GdnSpec gdn_;
};

}  // namespace kvtier
