// The layouts the fuzz target and its seed writer share: small, one per KV dtype, one mixed.
#pragma once

#include <memory>

#include "serialize/layout_registry.h"

namespace kvtier::fuzz {

inline std::unique_ptr<LayoutRegistry> make_registry() {
  auto reg = std::make_unique<LayoutRegistry>();
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16}) {
    (void)reg->add(KvLayout::uniform("fuzz", 2, 1, 8, 4, d));
  }
  KvLayout mixed = KvLayout::uniform("fuzz-mixed", 2, 2, 16, 2, DType::kF16);
  mixed.layers[1].dtype = DType::kBF16;
  (void)reg->add(mixed);
  return reg;
}

}  // namespace kvtier::fuzz
