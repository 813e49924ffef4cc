// A hybrid model's GDN state as an engine holds it — per GDN layer a (recurrent state [heads, d_k,
// d_v], conv window [conv_channels, conv_width - 1]) pair of f32 tensors — gathered into the
// snapshot bytes kvtier stores (HybridLayout's order: layer by layer, state then window), after
// every check: count, dtype, shape. Strided views are gathered element by element.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "inprocess/tensor_view.h"
#include "serialize/hybrid_layout.h"

namespace kvtier {

// invalid_argument naming the layer and tensor for anything that is not the layout's state.
Result<std::vector<uint8_t>> gather_state(const HybridLayout& layout, std::span<const LayerKv> state);

}  // namespace kvtier
