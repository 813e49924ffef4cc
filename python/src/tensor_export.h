// Blocks handed to Python without a copy: a BlockTensor is one K or V of a fetched block, a
// read-only view into the bytes the cache holds. It speaks DLPack (`torch.from_dlpack(t)` adopts
// it; bf16 as bfloat16) and the buffer protocol (`numpy.asarray(t)`; bf16 as uint16 words, since
// numpy has no bf16). Every consumer keeps the fetched blocks — and so their pins — alive.
#pragma once

#include <memory>

#include <pybind11/pybind11.h>

#include "inprocess/embedded_cache.h"

namespace kvtier::python {

class BlockTensor {
 public:
  BlockTensor(std::shared_ptr<FetchedBlocks> owner, const TensorView* view)
      : owner_(std::move(owner)), view_(view) {}

  // A "dltensor" capsule; its deleter (run by the consumer, with or without the GIL) only drops
  // a reference to the fetched blocks.
  pybind11::capsule dlpack() const;
  pybind11::buffer_info buffer() const;
  const TensorView& view() const { return *view_; }

 private:
  std::shared_ptr<FetchedBlocks> owner_;
  const TensorView* view_;  // inside *owner_
};

// Registers BlockTensor on the module.
void bind_block_tensor(pybind11::module_& m);

}  // namespace kvtier::python
