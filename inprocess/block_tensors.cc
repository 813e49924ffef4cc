#include "inprocess/block_tensors.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "serialize/affine_quant.h"

namespace kvtier {
namespace {

const char* part_name(KvPart p) { return p == KvPart::kK ? "k" : "v"; }

// What one tensor of a layer must look like: its last dimension and the dtypes it may have.
struct Expected {
  std::string name;  // "layer 3 k", "layer 3 k scales"
  int64_t last = 0;
  DType dtype = DType::kBF16;
  bool packed_words = false;  // U32 or I32
  // Dense K and V may be strided views (an engine's layout, e.g. FlashInfer's heads-before-tokens
  // blocks): each (token, head) row contiguous, rows apart. Quantized parts must be row-major.
  bool strided_rows = false;
};

// Elements from a block's first to its last element (the trailing three dimensions), or 0 when
// its (token, head) rows are not each contiguous and apart: the last dimension dense, and the
// token and head dimensions (those of extent > 1), smaller stride first, each stepping past all
// that the one before it spans.
int64_t block_span(const TensorView& t, size_t ndim) {
  const int64_t row = t.shape[ndim - 1];
  if (row > 1 && t.stride(ndim - 1) != 1) return 0;
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, extent)
  for (size_t d : {ndim - 3, ndim - 2}) {
    if (t.shape[d] > 1) dims.emplace_back(t.stride(d), t.shape[d]);
  }
  std::sort(dims.begin(), dims.end());
  int64_t covered = row, span = row;
  for (const auto& [stride, extent] : dims) {
    if (stride < covered) return 0;
    covered = stride * extent;
    span += (extent - 1) * stride;
  }
  return span;
}

std::string shape_text(const KvLayout& layout, int64_t last, BlockAddressing a) {
  return std::string("[") + (a == BlockAddressing::kPaged ? "num_blocks, " : "") +
         std::to_string(layout.block_size) + ", " + std::to_string(layout.num_kv_heads) + ", " +
         std::to_string(last) + "]";
}

Status check_view(const KvLayout& layout, const TensorView& t, const Expected& e,
                  BlockAddressing a, TensorAccess access, int64_t* blocks) {
  const size_t ndim = a == BlockAddressing::kPaged ? 4 : 3;
  const std::string want = shape_text(layout, e.last, a);
  if (!t.strides.empty() && t.strides.size() != t.shape.size()) {
    return invalid_argument(e.name + ": " + std::to_string(t.strides.size()) + " strides for " +
                            std::to_string(t.shape.size()) + " dimensions");
  }
  const size_t off = t.shape.size() >= 3 ? t.shape.size() - 3 : 0;
  if (t.shape.size() != ndim || t.shape[off] != layout.block_size ||
      t.shape[off + 1] != layout.num_kv_heads || t.shape[off + 2] != e.last) {
    return invalid_argument(e.name + ": shape " + t.describe() + ", expected " + want);
  }
  const bool dtype_ok = e.packed_words ? (t.dtype == DType::kU32 || t.dtype == DType::kI32)
                                       : t.dtype == e.dtype;
  if (!dtype_ok) {
    return invalid_argument(e.name + ": dtype " + std::string(dtype_name(t.dtype)) + ", expected " +
                            (e.packed_words ? std::string("U32 (or I32) packed words")
                                            : std::string(dtype_name(e.dtype)) + " as the layout holds"));
  }
  // A row-major block spans exactly its elements (dimensions of extent 1 may report any stride,
  // which must not shrink the span the overlap check below uses).
  const bool row_major = t.is_contiguous_from(ndim - 3);
  const int64_t span = row_major ? static_cast<int64_t>(layout.block_size) * layout.num_kv_heads * e.last
                                 : block_span(t, ndim);
  if (!row_major && (!e.strided_rows || span == 0)) {
    return invalid_argument(e.name + ": the last three dimensions of " + t.describe() + " are not contiguous" +
                            (e.strided_rows ? ": each (token, head) row must be contiguous and apart"
                                            : " (row-major); pass a contiguous tensor"));
  }
  if (a == BlockAddressing::kPaged && t.shape[0] > 1 && t.stride(0) < span) {
    return invalid_argument(e.name + ": blocks of " + t.describe() + " overlap (stride " +
                            std::to_string(t.stride(0)) + " < " + std::to_string(span) + " elements)");
  }
  if (t.data == nullptr && t.numel() > 0) return invalid_argument(e.name + ": null data pointer");
  if (access == TensorAccess::kWrite && t.read_only) {
    return invalid_argument(e.name + ": the tensor is read-only; kvtier loads into writable memory");
  }
  const int64_t n = a == BlockAddressing::kPaged ? t.shape[0] : 1;
  if (*blocks >= 0 && *blocks != n) {
    return invalid_argument(e.name + ": " + std::to_string(n) + " blocks, other tensors have " +
                            std::to_string(*blocks));
  }
  *blocks = n;
  return ok_status();
}

Status check_kv(const KvLayout& layout, int l, KvPart p, const KvTensor& t, BlockAddressing a,
                TensorAccess access, int64_t* blocks) {
  const std::string name = "layer " + std::to_string(l) + " " + part_name(p);
  const LayerSpec& spec = layout.layers[l];
  if (t.parts.size() == 1) {
    return check_view(layout, t.parts[0], {name, layout.head_dim, spec.dtype, false, true}, a, access, blocks);
  }
  if (t.parts.size() != 3) {
    return invalid_argument(name + ": expected a tensor or a (packed, scales, biases) triple, got " +
                            std::to_string(t.parts.size()) + " tensors");
  }
  if (access == TensorAccess::kWrite) {
    return invalid_argument(name + ": kvtier loads a quantized layer dequantized; pass a dense " +
                            std::string(dtype_name(spec.dtype)) + " tensor " +
                            shape_text(layout, layout.head_dim, a));
  }
  if (!spec.quantization) {
    return invalid_argument(name + ": a quantized triple, but the layout keeps layer " +
                            std::to_string(l) + " dense (declare its quantization in the layout)");
  }
  const Quantization& q = *spec.quantization;
  const int64_t words = static_cast<int64_t>(layout.head_dim) * q.bits / 32;
  const int64_t groups = layout.head_dim / q.group_size;
  const TensorView& packed = t.parts[0];
  if (packed.shape.size() >= 1 && packed.shape.back() != words && packed.shape.back() > 0) {
    return invalid_argument(name + " packed: " + std::to_string(packed.shape.back()) +
                            " words per head row are " +
                            std::to_string(packed.shape.back() * 32 / layout.head_dim) +
                            " bits, the layout quantizes layer " + std::to_string(l) + " to " +
                            std::to_string(q.bits) + " bits (" + std::to_string(words) + " words)");
  }
  const TensorView& scales = t.parts[1];
  if (scales.shape.size() >= 1 && scales.shape.back() != groups && scales.shape.back() > 0) {
    return invalid_argument(name + " scales: " + std::to_string(scales.shape.back()) +
                            " groups per head row mean group size " +
                            std::to_string(layout.head_dim / scales.shape.back()) +
                            ", the layout's is " + std::to_string(q.group_size));
  }
  KVTIER_RETURN_IF_ERROR(check_view(layout, packed, {name + " packed", words, DType::kU32, true}, a,
                                    access, blocks));
  KVTIER_RETURN_IF_ERROR(check_view(layout, scales, {name + " scales", groups, spec.dtype}, a, access, blocks));
  return check_view(layout, t.parts[2], {name + " biases", groups, spec.dtype}, a, access, blocks);
}

// The first byte of block `index`'s slab in `t`.
template <typename Ptr>
Ptr slab(const TensorView& t, int64_t index) {
  const int64_t elements = t.shape.size() == 4 ? index * t.stride(0) : 0;
  return static_cast<Ptr>(t.data) + elements * static_cast<int64_t>(dtype_size(t.dtype));
}

// Calls fn(tensor bytes, offset in the block's row-major [tokens, heads, row] bytes, length) for
// block `index` of dense `t`: once when `t` holds the block row-major, else once per row.
template <typename Fn>
void for_each_run(const TensorView& t, int64_t index, size_t bytes, Fn fn) {
  const size_t nd = t.shape.size();
  uint8_t* at = slab<uint8_t*>(t, index);
  if (t.is_contiguous_from(nd - 3)) {
    fn(at, size_t{0}, bytes);
    return;
  }
  const int64_t tokens = t.shape[nd - 3], heads = t.shape[nd - 2];
  const int64_t es = static_cast<int64_t>(dtype_size(t.dtype));
  const size_t row = static_cast<size_t>(t.shape[nd - 1] * es);
  for (int64_t k = 0; k < tokens; ++k) {
    for (int64_t h = 0; h < heads; ++h) {
      fn(at + (k * t.stride(nd - 3) + h * t.stride(nd - 2)) * es, static_cast<size_t>(k * heads + h) * row, row);
    }
  }
}

}  // namespace

Result<int64_t> check_layer_tensors(const KvLayout& layout, std::span<const LayerKv> layers,
                                    BlockAddressing addressing, TensorAccess access) {
  if (static_cast<int>(layers.size()) != layout.num_layers) {
    return invalid_argument(std::to_string(layers.size()) + " layers given, the layout '" + layout.name +
                            "' has " + std::to_string(layout.num_layers));
  }
  int64_t blocks = -1;
  for (int l = 0; l < layout.num_layers; ++l) {
    const LayerKv& kv = layers[l];
    if (kv.k.quantized() != kv.v.quantized() && kv.k.parts.size() + kv.v.parts.size() == 4) {
      return invalid_argument("layer " + std::to_string(l) +
                              ": k and v must both be dense or both quantized triples");
    }
    KVTIER_RETURN_IF_ERROR(check_kv(layout, l, KvPart::kK, kv.k, addressing, access, &blocks));
    KVTIER_RETURN_IF_ERROR(check_kv(layout, l, KvPart::kV, kv.v, addressing, access, &blocks));
  }
  return blocks;
}

Block::LayerForms forms_of(const KvLayout& layout, std::span<const LayerKv> layers) {
  Block::LayerForms forms(layout.num_layers);
  for (int l = 0; l < layout.num_layers; ++l) {
    if (layers[l].k.quantized()) forms[l] = layout.layers[l].quantization;
  }
  return forms;
}

void gather_block(std::span<const LayerKv> layers, int64_t index, Block& out) {
  for (size_t l = 0; l < layers.size(); ++l) {
    const int layer = static_cast<int>(l);
    for (KvPart p : {KvPart::kK, KvPart::kV}) {
      const KvTensor& t = p == KvPart::kK ? layers[l].k : layers[l].v;
      if (!out.is_quantized(layer)) {
        std::span<uint8_t> dst = out.dense_part(layer, p);
        for_each_run(t.parts[0], index, dst.size(),
                     [&](const uint8_t* from, size_t at, size_t n) { std::memcpy(dst.data() + at, from, n); });
        continue;
      }
      QuantizedParts<uint8_t> q = out.quantized_part(layer, p);
      std::memcpy(q.packed.data(), slab<const uint8_t*>(t.parts[0], index), q.packed.size());
      std::memcpy(q.scales.data(), slab<const uint8_t*>(t.parts[1], index), q.scales.size());
      std::memcpy(q.biases.data(), slab<const uint8_t*>(t.parts[2], index), q.biases.size());
    }
  }
}

Status scatter_block(const Block& block, std::span<const LayerKv> layers, int64_t index) {
  const KvLayout& layout = block.layout();
  for (int l = 0; l < layout.num_layers; ++l) {
    for (KvPart p : {KvPart::kK, KvPart::kV}) {
      const TensorView& t = (p == KvPart::kK ? layers[l].k : layers[l].v).parts[0];
      uint8_t* dst = slab<uint8_t*>(t, index);
      const size_t bytes = layout.dense_tensor_bytes(l);
      if (!block.is_quantized(l)) {
        const std::span<const uint8_t> src = block.dense_part(l, p);
        for_each_run(t, index, bytes, [&](uint8_t* to, size_t at, size_t n) { std::memcpy(to, src.data() + at, n); });
        continue;
      }
      if (!t.is_contiguous_from(t.shape.size() - 3)) {
        return invalid_argument("layer " + std::to_string(l) +
                                ": a quantized block dequantizes only into a row-major tensor");
      }
      QuantizedParts<const uint8_t> q = block.quantized_part(l, p);
      // Parts start 16-byte aligned in the block's storage (serialize/block.cc).
      std::span<const uint32_t> words(reinterpret_cast<const uint32_t*>(q.packed.data()),
                                      q.packed.size() / 4);
      KVTIER_RETURN_IF_ERROR(affine_dequantize(layout.layers[l].dtype, *block.form(l), words,
                                               q.scales, q.biases, {dst, bytes})
                                 .with_context("layer " + std::to_string(l)));
    }
  }
  return ok_status();
}

std::vector<LayerKv> dense_block_views(const KvLayout& layout, const uint8_t* base, bool read_only) {
  std::vector<LayerKv> out(layout.num_layers);
  size_t offset = 0;
  for (int l = 0; l < layout.num_layers; ++l) {
    for (KvTensor* t : {&out[l].k, &out[l].v}) {
      TensorView v;
      v.data = const_cast<uint8_t*>(base + offset);  // read_only says whether writing is allowed
      v.dtype = layout.layers[l].dtype;
      v.shape = {layout.block_size, layout.num_kv_heads, layout.head_dim};
      v.read_only = read_only;
      t->parts.push_back(std::move(v));
      offset += layout.dense_tensor_bytes(l);
    }
  }
  return out;
}

}  // namespace kvtier
