#include "inprocess/tensor_view.h"

namespace kvtier {

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

int64_t TensorView::stride(size_t d) const {
  if (!strides.empty()) return strides[d];
  int64_t s = 1;
  for (size_t i = d + 1; i < shape.size(); ++i) s *= shape[i];
  return s;
}

bool TensorView::is_contiguous_from(size_t first) const {
  int64_t expected = 1;
  for (size_t d = shape.size(); d-- > first;) {
    // A dimension of extent 1 may carry any stride (frameworks differ on what they report).
    if (shape[d] != 1 && stride(d) != expected) return false;
    expected *= shape[d];
  }
  return true;
}

std::string TensorView::describe() const {
  std::string out(dtype_name(dtype));
  out += "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

}  // namespace kvtier
