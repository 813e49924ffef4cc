#include "python/src/tensor_import.h"

#include <dlpack/dlpack.h>

#include <limits>

namespace py = pybind11;

namespace kvtier::python {
namespace {

[[noreturn]] void value_error(const std::string& message) { throw py::value_error(message); }

// What an element type is to kvtier; `u16` marks 16-bit unsigned words, read as bf16 on request.
struct ElementType {
  std::optional<DType> dtype;
  bool u16 = false;
  bool i64 = false;  // only token ids may be int64
  std::string name;
};

ElementType dlpack_type(const DLDataType& t) {
  ElementType e;
  e.name = "DLPack code " + std::to_string(t.code) + " bits " + std::to_string(t.bits);
  if (t.lanes != 1) return e;
  switch (t.code) {
    case kDLFloat:
      if (t.bits == 32) e.dtype = DType::kF32;
      if (t.bits == 16) e.dtype = DType::kF16;
      break;
    case kDLBfloat:
      if (t.bits == 16) e.dtype = DType::kBF16;
      break;
    case kDLUInt:
      if (t.bits == 32) e.dtype = DType::kU32;
      if (t.bits == 8) e.dtype = DType::kU8;
      e.u16 = t.bits == 16;
      break;
    case kDLInt:
      if (t.bits == 32) e.dtype = DType::kI32;
      if (t.bits == 8) e.dtype = DType::kI8;
      e.i64 = t.bits == 64;
      break;
    default:
      break;
  }
  return e;
}

ElementType buffer_type(const py::buffer_info& b) {
  ElementType e;
  std::string f = b.format;
  if (!f.empty() && (f[0] == '<' || f[0] == '=' || f[0] == '@')) f.erase(0, 1);
  e.name = "buffer format '" + b.format + "'";
  if (f.size() != 1) return e;
  const char c = f[0];
  const auto size = b.itemsize;
  if (c == 'f' && size == 4) e.dtype = DType::kF32;
  if (c == 'e' && size == 2) e.dtype = DType::kF16;
  if ((c == 'I' || c == 'L') && size == 4) e.dtype = DType::kU32;
  if ((c == 'i' || c == 'l') && size == 4) e.dtype = DType::kI32;
  if (c == 'B' && size == 1) e.dtype = DType::kU8;
  if (c == 'b' && size == 1) e.dtype = DType::kI8;
  e.u16 = c == 'H' && size == 2;
  e.i64 = (c == 'q' || c == 'l') && size == 8;
  return e;
}

DType resolve(const ElementType& e, const ImportHints& hints, const std::string& what) {
  if (e.u16) {
    if (hints.u16_is_bf16) return DType::kBF16;
    value_error(what + ": 16-bit unsigned words; pass dtype=\"bf16\" if they are bf16 values");
  }
  if (!e.dtype) value_error(what + ": unsupported element type (" + e.name + ")");
  return *e.dtype;
}

// The view with its element type still unresolved (`type`), so token ids can be int64.
ImportedTensor from_buffer(py::handle obj, const std::string& what, ElementType* type) {
  ImportedTensor t;
  t.buffer = std::make_shared<py::buffer_info>(py::reinterpret_borrow<py::buffer>(obj).request());
  const py::buffer_info& b = *t.buffer;
  *type = buffer_type(b);
  t.view.data = b.ptr;
  t.view.read_only = b.readonly;
  for (py::ssize_t d = 0; d < b.ndim; ++d) {
    if (b.strides[d] % b.itemsize != 0) value_error(what + ": strides are not whole elements");
    t.view.shape.push_back(b.shape[d]);
    t.view.strides.push_back(b.strides[d] / b.itemsize);
  }
  return t;
}

// DLPack's device of `obj`, when it says (`__dlpack_device__`).
std::optional<std::pair<int, int>> dlpack_device(py::handle obj) {
  if (!py::hasattr(obj, "__dlpack_device__")) return std::nullopt;
  auto d = obj.attr("__dlpack_device__")().cast<std::pair<int, int>>();
  return d;
}

ImportedTensor from_dlpack(py::handle obj, const std::string& what, ElementType* type, const ImportHints& hints) {
  ImportedTensor t;
  const auto device = dlpack_device(obj);
  const bool cuda = device && device->first == kDLCUDA;
  try {
    // A CUDA tensor is only looked at (its bytes move on the caller's stream, ordered by the CUDA
    // path): stream=-1 asks the producer not to synchronize anything for this export.
    t.capsule = cuda ? obj.attr("__dlpack__")(py::arg("stream") = -1) : obj.attr("__dlpack__")();
  } catch (py::error_already_set& e) {
    // numpy will not export a read-only array through DLPack (0.6 cannot say "read-only"); the
    // buffer protocol can, and kvtier only reads from it.
    if (!cuda && e.matches(PyExc_BufferError) && PyObject_CheckBuffer(obj.ptr())) return from_buffer(obj, what, type);
    throw;
  }
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(t.capsule.ptr(), "dltensor"));
  if (managed == nullptr) throw py::error_already_set();
  // We never rename the capsule: the producer's capsule destructor frees the tensor when the
  // capsule goes, as the DLPack protocol has it for a consumer that only borrowed.
  const DLTensor& dl = managed->dl_tensor;
  if (dl.device.device_type == kDLCUDA && hints.allow_cuda) {
    t.cuda_device = dl.device.device_id;
  } else if (dl.device.device_type != kDLCPU && dl.device.device_type != kDLCUDAHost) {
    value_error(what + ": the tensor is on device type " + std::to_string(dl.device.device_type) +
                "; kvtier exchanges host memory and CUDA tensors (torch's, through save_blocks, "
                "load_blocks and store)");
  }
  *type = dlpack_type(dl.dtype);
  t.view.data = static_cast<uint8_t*>(dl.data) + dl.byte_offset;
  t.view.shape.assign(dl.shape, dl.shape + dl.ndim);
  if (dl.strides != nullptr) t.view.strides.assign(dl.strides, dl.strides + dl.ndim);
  return t;
}

bool is_tensor(py::handle obj) { return py::hasattr(obj, "__dlpack__") || PyObject_CheckBuffer(obj.ptr()); }

ImportedTensor import_raw(py::handle obj, const std::string& what, ElementType* type,
                          const ImportHints& hints = {}) {
  if (py::hasattr(obj, "__dlpack__")) return from_dlpack(obj, what, type, hints);
  if (PyObject_CheckBuffer(obj.ptr())) return from_buffer(obj, what, type);
  value_error(what + ": " + std::string(py::str(py::type::of(obj).attr("__name__"))) +
              " is not a tensor (no __dlpack__, no buffer protocol)");
}

KvTensor import_kv(py::handle obj, const ImportHints& hints, const std::string& what,
                   std::vector<ImportedTensor>& keep) {
  KvTensor kv;
  if (is_tensor(obj)) {
    keep.push_back(import_tensor(obj, hints, what));
    kv.parts.push_back(keep.back().view);
    return kv;
  }
  if (!py::isinstance<py::sequence>(obj) || py::len(obj) != 3) {
    value_error(what + ": expected a tensor or a (packed, scales, biases) triple, got " +
                std::string(py::str(py::type::of(obj).attr("__name__"))));
  }
  const char* names[] = {"packed", "scales", "biases"};
  py::sequence seq = py::reinterpret_borrow<py::sequence>(obj);
  for (size_t i = 0; i < 3; ++i) {
    keep.push_back(import_tensor(seq[i], hints, what + " " + names[i]));
    kv.parts.push_back(keep.back().view);
  }
  return kv;
}

}  // namespace

ImportedTensor import_tensor(py::handle obj, const ImportHints& hints, const std::string& what) {
  ElementType type;
  ImportedTensor t = import_raw(obj, what, &type, hints);
  t.view.dtype = resolve(type, hints, what);
  return t;
}

int ImportedLayers::cuda_device() const {
  if (keep.empty()) return -1;
  const int first = keep.front().cuda_device;
  for (const ImportedTensor& t : keep) {
    if (t.cuda_device != first) {
      throw py::value_error("the KV tensors are on different devices (CUDA " + std::to_string(first) + " and " +
                            (t.cuda_device < 0 ? std::string("the host") : "CUDA " + std::to_string(t.cuda_device)) +
                            "): pass them all on one GPU");
    }
  }
  return first;
}

ImportedLayers import_layers(py::handle obj, const ImportHints& hints, const std::string& what) {
  ImportedLayers out;
  if (is_tensor(obj)) {
    // One tensor [num_layers, ...]: each layer is a view at its offset along dimension 0.
    ImportedTensor all = import_tensor(obj, hints, what);
    const TensorView& v = all.view;
    if (v.shape.empty()) value_error(what + ": a tensor with a leading layer dimension, got a scalar");
    for (int64_t l = 0; l < v.shape[0]; ++l) {
      TensorView layer = v;
      layer.shape.erase(layer.shape.begin());
      if (!layer.strides.empty()) layer.strides.erase(layer.strides.begin());
      layer.data = static_cast<uint8_t*>(v.data) + l * v.stride(0) * dtype_size(v.dtype);
      out.layers.push_back(KvTensor{{layer}});
    }
    out.keep.push_back(std::move(all));
    return out;
  }
  if (!py::isinstance<py::sequence>(obj)) {
    value_error(what + ": expected one tensor per layer (a list), or one tensor with a leading layer dimension");
  }
  py::sequence seq = py::reinterpret_borrow<py::sequence>(obj);
  for (size_t l = 0; l < seq.size(); ++l) {
    out.layers.push_back(import_kv(seq[l], hints, what + " of layer " + std::to_string(l), out.keep));
  }
  return out;
}

std::vector<LayerKv> import_block_layers(py::handle obj, const ImportHints& hints,
                                         std::vector<ImportedTensor>& keep) {
  if (!py::isinstance<py::sequence>(obj) || is_tensor(obj)) {
    value_error("layers: expected a list of (k, v) pairs, one per layer");
  }
  std::vector<LayerKv> out;
  py::sequence seq = py::reinterpret_borrow<py::sequence>(obj);
  for (size_t l = 0; l < seq.size(); ++l) {
    py::handle pair = seq[l];
    if (!py::isinstance<py::sequence>(pair) || is_tensor(pair) || py::len(pair) != 2) {
      value_error("layers[" + std::to_string(l) + "]: expected a (k, v) pair");
    }
    py::sequence kv = py::reinterpret_borrow<py::sequence>(pair);
    const std::string where = "layer " + std::to_string(l);
    LayerKv layer;
    layer.k = import_kv(kv[0], hints, where + " k", keep);
    layer.v = import_kv(kv[1], hints, where + " v", keep);
    out.push_back(std::move(layer));
  }
  return out;
}

std::vector<uint32_t> import_tokens(py::handle obj, const char* what, const char* item) {
  std::vector<uint32_t> out;
  auto put = [&](int64_t v) {
    if (v < 0 || v > std::numeric_limits<uint32_t>::max()) {
      value_error(std::string(what) + ": " + item + " " + std::to_string(v) + " is outside [0, 2^32)");
    }
    out.push_back(static_cast<uint32_t>(v));
  };
  if (is_tensor(obj)) {
    ElementType type;
    ImportedTensor t = import_raw(obj, what, &type);
    const TensorView& v = t.view;
    const bool i32 = type.dtype == DType::kI32, u32 = type.dtype == DType::kU32;
    if (v.shape.size() != 1 || !(i32 || u32 || type.i64)) {
      value_error(std::string(what) + ": expected a 1-D tensor of int32, uint32 or int64 token ids");
    }
    out.reserve(v.shape[0]);
    for (int64_t i = 0; i < v.shape[0]; ++i) {
      const auto* p = static_cast<const uint8_t*>(v.data) + i * v.stride(0) * (type.i64 ? 8 : 4);
      if (type.i64) put(*reinterpret_cast<const int64_t*>(p));
      else if (i32) put(*reinterpret_cast<const int32_t*>(p));
      else put(*reinterpret_cast<const uint32_t*>(p));
    }
    return out;
  }
  if (!py::isinstance<py::sequence>(obj)) value_error(std::string(what) + ": expected a sequence of token ids");
  py::sequence seq = py::reinterpret_borrow<py::sequence>(obj);
  out.reserve(seq.size());
  for (py::handle v : seq) {
    if (!py::isinstance<py::int_>(v) && !py::hasattr(v, "__index__")) {
      value_error(std::string(what) + ": " + item + "s must be integers");
    }
    // Through __index__ with overflow reported: a Python int past int64 (2^64, say) is a token
    // id out of range like any other, not a failed cast.
    py::object index = py::reinterpret_steal<py::object>(PyNumber_Index(v.ptr()));
    if (!index) throw py::error_already_set();
    int overflow = 0;
    const long long x = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
    if (overflow != 0) {
      value_error(std::string(what) + ": " + item + " " + py::str(index).cast<std::string>() + " is outside [0, 2^32)");
    }
    put(static_cast<int64_t>(x));
  }
  return out;
}

}  // namespace kvtier::python
