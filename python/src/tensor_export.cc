#include "python/src/tensor_export.h"

#include <dlpack/dlpack.h>

namespace py = pybind11;

namespace kvtier::python {
namespace {

// What a capsule's DLManagedTensor points back to: the owner that keeps the bytes alive, and the
// shape and strides arrays DLPack borrows.
struct ExportContext {
  std::shared_ptr<FetchedBlocks> owner;
  std::vector<int64_t> shape, strides;
  DLManagedTensor managed{};
};

DLDataType dlpack_dtype(DType d) {
  switch (d) {
    case DType::kF32: return {kDLFloat, 32, 1};
    case DType::kF16: return {kDLFloat, 16, 1};
    case DType::kBF16: return {kDLBfloat, 16, 1};
    case DType::kU32: return {kDLUInt, 32, 1};
    case DType::kI32: return {kDLInt, 32, 1};
    case DType::kU8: return {kDLUInt, 8, 1};
    case DType::kI8: return {kDLInt, 8, 1};
  }
  return {kDLUInt, 8, 1};
}

// Buffer-protocol format characters; bf16 is shown as its 16-bit words.
const char* buffer_format(DType d) {
  switch (d) {
    case DType::kF32: return "f";
    case DType::kF16: return "e";
    case DType::kBF16: return "H";
    case DType::kU32: return "I";
    case DType::kI32: return "i";
    case DType::kU8: return "B";
    case DType::kI8: return "b";
  }
  return "B";
}

const char* python_dtype_name(DType d) {
  switch (d) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    default: return "other";
  }
}

void delete_context(DLManagedTensor* self) { delete static_cast<ExportContext*>(self->manager_ctx); }

// A capsule nobody consumed still owns its tensor; a consumed one was renamed "used_dltensor".
void capsule_destructor(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, "dltensor")) return;
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
  if (m != nullptr) m->deleter(m);
  PyErr_Restore(type, value, traceback);
}

}  // namespace

py::capsule BlockTensor::dlpack() const {
  auto ctx = std::make_unique<ExportContext>();
  ctx->owner = owner_;
  ctx->shape = view_->shape;
  for (size_t d = 0; d < view_->shape.size(); ++d) ctx->strides.push_back(view_->stride(d));
  DLTensor& t = ctx->managed.dl_tensor;
  t.data = view_->data;
  t.device = {kDLCPU, 0};
  t.ndim = static_cast<int>(ctx->shape.size());
  t.dtype = dlpack_dtype(view_->dtype);
  t.shape = ctx->shape.data();
  t.strides = ctx->strides.data();
  t.byte_offset = 0;
  ctx->managed.manager_ctx = ctx.get();
  ctx->managed.deleter = delete_context;
  DLManagedTensor* managed = &ctx->managed;
  PyObject* capsule = PyCapsule_New(managed, "dltensor", capsule_destructor);
  if (capsule == nullptr) throw py::error_already_set();
  ctx.release();  // now owned by the capsule (or by whoever consumes it)
  return py::reinterpret_steal<py::capsule>(capsule);
}

py::buffer_info BlockTensor::buffer() const {
  const size_t item = dtype_size(view_->dtype);
  std::vector<py::ssize_t> shape(view_->shape.begin(), view_->shape.end()), strides;
  for (size_t d = 0; d < shape.size(); ++d) strides.push_back(view_->stride(d) * static_cast<py::ssize_t>(item));
  return py::buffer_info(view_->data, static_cast<py::ssize_t>(item), buffer_format(view_->dtype),
                         static_cast<py::ssize_t>(shape.size()), shape, strides, /*readonly=*/true);
}

void bind_block_tensor(py::module_& m) {
  py::class_<BlockTensor>(m, "BlockTensor", py::buffer_protocol(),
                          "One K or V of a fetched block: a read-only view into the cached bytes.\n"
                          "torch.from_dlpack(t) adopts it without a copy (bf16 as bfloat16);\n"
                          "numpy.asarray(t) reads it through the buffer protocol (bf16 as uint16).")
      .def_buffer([](const BlockTensor& t) { return t.buffer(); })
      .def("__dlpack__", [](const BlockTensor& t, py::object /*stream*/) { return t.dlpack(); },
           py::arg("stream") = py::none())
      .def("__dlpack_device__", [](const BlockTensor&) { return py::make_tuple(static_cast<int>(kDLCPU), 0); })
      .def_property_readonly("dtype", [](const BlockTensor& t) { return python_dtype_name(t.view().dtype); })
      .def_property_readonly("shape", [](const BlockTensor& t) {
        py::tuple shape(t.view().shape.size());
        for (size_t d = 0; d < t.view().shape.size(); ++d) shape[d] = t.view().shape[d];
        return shape;
      })
      .def_property_readonly("nbytes", [](const BlockTensor& t) {
        return t.view().numel() * static_cast<int64_t>(dtype_size(t.view().dtype));
      });
}

}  // namespace kvtier::python
