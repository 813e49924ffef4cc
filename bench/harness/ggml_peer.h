// ggml-vulkan's figures beside ours: the perf lines of ggml's test-backend-ops as the peer kit
// (../shared/device/ggml-peer/run.sh) prints them in the same device call, read back so that
// engine_bench and matmul_bench can print "ggml-vulkan" columns and ratios themselves instead of
// someone assembling them by hand. A line looks like
//   MUL_MAT(type_a=f16,type_b=f32,m=8192,n=8192,k=2048,...,prec=f32,peer=kvtier):   24 runs -
//   1234.56 us/run - ...
// (possibly wrapped in terminal colour codes); everything else in the run's output is skipped.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace kvtier::bench {

struct GgmlPeerCase {
  std::string op;                             // MUL_MAT, FLASH_ATTN_EXT, ...
  std::map<std::string, std::string> params;  // as printed: "8192", "[4,1]", "f16"
  double us_per_run = 0;

  std::optional<int64_t> integer(const std::string& key) const;
  // The integers of an "[a,b,...]" parameter.
  std::vector<int64_t> integers(const std::string& key) const;
  bool has(const std::string& key, const std::string& value) const;
};

class GgmlPeer {
 public:
  // Cases of every perf line in `text`.
  static GgmlPeer parse(std::string_view text);
  // The file's cases; an error when it cannot be read or holds no perf line (a wrong file given
  // would otherwise print empty columns silently).
  static Result<GgmlPeer> read(const std::string& path);

  const std::vector<GgmlPeerCase>& cases() const { return cases_; }

  // MUL_MAT of weights of `weight_type` (ggml's name: f16, bf16) [k, n_out] by `rows` activation
  // rows: the fastest us/run among its f32-accumulating variants (prec=f32; any precision where
  // the run printed none), over activation types. Nothing when the run has no such case.
  std::optional<double> mul_mat_us(int64_t rows, int64_t k, int64_t n_out,
                                   const std::string& weight_type) const;
  // FLASH_ATTN_EXT with f16 K/V: `queries` rows of each of `sequences` sequences against
  // `context` keys, `kv_heads` x `gqa` heads of `head_dim`; causal mask (the peer kit's
  // mask_pattern=causal) or none. Fastest over precisions.
  std::optional<double> attention_us(int64_t head_dim, int64_t kv_heads, int64_t gqa,
                                     int64_t queries, int64_t context, int64_t sequences,
                                     bool causal) const;

 private:
  std::vector<GgmlPeerCase> cases_;
};

}  // namespace kvtier::bench
