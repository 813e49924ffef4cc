// TensorView: an engine's array as kvtier borrows it — a host pointer, a dtype, a shape and
// strides — whatever produced it (a DLPack tensor from torch, MLX or numpy, a Python buffer, a C
// caller's pointer). kvtier never owns or converts the memory behind a view: it copies bytes in or
// out of it, unchanged, during one call.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "serialize/dtype.h"

namespace kvtier {

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kBF16;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // in elements, one per dimension; empty means row-major
  bool read_only = false;        // kvtier refuses to load into a read-only view

  int64_t numel() const;
  // The stride of dimension `d` in elements (row-major when `strides` is empty).
  int64_t stride(size_t d) const;
  // True when dimensions [first, ndim) are laid out row-major without gaps, so each index of the
  // dimensions before `first` addresses one contiguous run of bytes.
  bool is_contiguous_from(size_t first) const;
  // "BF16[16, 8, 128]", for error messages.
  std::string describe() const;
};

// One layer's K or V as an engine holds it: a dense tensor in the layer's dtype, or an
// affine-quantized triple as MLX keeps it (packed uint32 words, scales, biases).
struct KvTensor {
  std::vector<TensorView> parts;  // 1 = dense; 3 = (packed, scales, biases)
  bool quantized() const { return parts.size() == 3; }
};

struct LayerKv {
  KvTensor k;
  KvTensor v;
};

// Whether kvtier reads an engine's tensors (store, save) or writes them (load).
enum class TensorAccess { kRead, kWrite };

}  // namespace kvtier
