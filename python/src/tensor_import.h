// Python objects an engine passes as tensors, read as kvtier TensorViews: anything with
// `__dlpack__` (torch, MLX, CuPy host arrays, numpy) or the buffer protocol (numpy, memoryview,
// array). DLPack dtypes map one to one (bfloat16 included); numpy has no bf16, so its users pass
// uint16 arrays of bf16 words and say so with dtype="bf16". Nothing is copied or converted here.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <pybind11/pybind11.h>

#include "inprocess/tensor_view.h"

namespace kvtier::python {

// A view and what keeps its memory alive (the DLPack capsule or the Py_buffer). Destroy with the
// GIL held.
struct ImportedTensor {
  TensorView view;
  int cuda_device = -1;  // the CUDA ordinal of a device tensor (ImportHints::allow_cuda); -1: host
  pybind11::object capsule;
  std::shared_ptr<pybind11::buffer_info> buffer;
};

// How 16-bit unsigned words (numpy uint16) are to be read: only as bf16, and only when asked.
struct ImportHints {
  bool u16_is_bf16 = false;
  // Accept CUDA tensors: their views point into device memory, to be checked for shape and
  // layout, never read (the CUDA path moves the bytes).
  bool allow_cuda = false;
};

// Raises ValueError naming `what` for a tensor kvtier cannot read (not on the host, an unknown
// dtype, a uint16 array without dtype="bf16").
ImportedTensor import_tensor(pybind11::handle obj, const ImportHints& hints, const std::string& what);

// The per-layer K (or V) of an engine: a sequence with one entry per layer, each a tensor or a
// (packed, scales, biases) triple; or one tensor with a leading layer dimension.
struct ImportedLayers {
  std::vector<KvTensor> layers;
  std::vector<ImportedTensor> keep;  // owners of every view above
  // The CUDA ordinal every tensor is on, -1 when all are on the host; ValueError for a mix.
  int cuda_device() const;
};
ImportedLayers import_layers(pybind11::handle obj, const ImportHints& hints, const std::string& what);

// One block's layers for store(): a list of (k, v) pairs, each a tensor or a quantized triple.
std::vector<LayerKv> import_block_layers(pybind11::handle obj, const ImportHints& hints,
                                         std::vector<ImportedTensor>& keep);

// Token ids: a sequence of ints or a 1-D integer tensor/array; each must fit in uint32.
std::vector<uint32_t> import_tokens(pybind11::handle obj, const char* what, const char* item = "token id");

}  // namespace kvtier::python
