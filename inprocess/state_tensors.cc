#include "inprocess/state_tensors.h"

#include <cstring>
#include <string>

namespace kvtier {
namespace {

Status check_part(const KvTensor& t, const std::vector<int64_t>& shape, const std::string& what) {
  if (t.parts.size() != 1) return invalid_argument(what + ": a dense f32 tensor, not a quantized triple");
  const TensorView& v = t.parts[0];
  if (v.dtype != DType::kF32) return invalid_argument(what + ": " + v.describe() + ", GDN state is F32");
  if (v.shape != shape) {
    std::string want = "[";
    for (size_t i = 0; i < shape.size(); ++i) want += (i ? ", " : "") + std::to_string(shape[i]);
    return invalid_argument(what + ": " + v.describe() + ", expected shape " + want + "]");
  }
  return ok_status();
}

// Appends the elements of `v` in row-major order.
void append_f32(const TensorView& v, std::vector<uint8_t>& out) {
  const size_t at = out.size(), n = static_cast<size_t>(v.numel());
  out.resize(at + n * sizeof(float));
  const float* src = static_cast<const float*>(v.data);
  if (v.is_contiguous_from(0)) {
    std::memcpy(out.data() + at, src, n * sizeof(float));
    return;
  }
  std::vector<int64_t> index(v.shape.size(), 0);
  for (size_t i = 0; i < n; ++i) {
    int64_t offset = 0;
    for (size_t d = 0; d < index.size(); ++d) offset += index[d] * v.stride(d);
    std::memcpy(out.data() + at + i * sizeof(float), src + offset, sizeof(float));
    for (size_t d = index.size(); d-- > 0;) {  // the next index, last dimension fastest
      if (++index[d] < v.shape[d]) break;
      index[d] = 0;
    }
  }
}

}  // namespace

Result<std::vector<uint8_t>> gather_state(const HybridLayout& layout, std::span<const LayerKv> state) {
  if (static_cast<int>(state.size()) != layout.gdn_layers()) {
    return invalid_argument("state: " + std::to_string(state.size()) + " layers, the hybrid layout has " +
                            std::to_string(layout.gdn_layers()) + " GDN layers");
  }
  const GdnSpec& g = layout.gdn();
  const std::vector<int64_t> state_shape{g.heads, g.d_k, g.d_v}, window_shape{g.conv_channels, g.conv_width - 1};
  for (size_t i = 0; i < state.size(); ++i) {
    KVTIER_RETURN_IF_ERROR(check_part(state[i].k, state_shape, "state[" + std::to_string(i) + "] state"));
    KVTIER_RETURN_IF_ERROR(check_part(state[i].v, window_shape, "state[" + std::to_string(i) + "] conv_window"));
  }
  std::vector<uint8_t> out;
  out.reserve(layout.snapshot_bytes());
  for (const LayerKv& l : state) {
    append_f32(l.k.parts[0], out);
    append_f32(l.v.parts[0], out);
  }
  return out;
}

}  // namespace kvtier
