// Moving one block's K and V between an engine's tensors and a Block: the checks that an engine's
// arrays have the layout's shape and dtype, the gather of block `i` out of them (store, save) and
// the scatter of a Block into them (load). Bytes are copied as they are — bf16 stays bf16 — except
// that a layer the Block holds quantized is dequantized into a dense destination (the formula of
// serialize/affine_quant.h, so the result equals the CPU dequantize byte for byte).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "inprocess/tensor_view.h"
#include "serialize/block.h"

namespace kvtier {

// How an engine's tensors address blocks: one block's [block_size, kv_heads, head_dim], or a
// paged array [num_blocks, block_size, kv_heads, head_dim] indexed by block id.
enum class BlockAddressing { kOneBlock, kPaged };


// Checks every layer's K and V against `layout`: the right number of layers; dense parts in the
// layer's dtype; quantized triples only for a layer the layout keeps quantized, with its bits and
// group size (packed words U32 or I32); the trailing three dimensions row-major; for kPaged, one
// leading block dimension whose slabs do not overlap and the same number of blocks everywhere;
// for kWrite, dense and writable. Returns the number of blocks (1 for kOneBlock). Error messages
// name the layer, the part and what was expected ("layer 3 v: dtype F16, the layout holds BF16").
Result<int64_t> check_layer_tensors(const KvLayout& layout, std::span<const LayerKv> layers,
                                    BlockAddressing addressing, TensorAccess access);

// The per-layer forms a Block needs to hold `layers` as given (quantized where a triple was
// passed). `layers` must have passed check_layer_tensors.
Block::LayerForms forms_of(const KvLayout& layout, std::span<const LayerKv> layers);

// Copies block `index` of `layers` (0 for kOneBlock) into `out`, whose forms are forms_of(layers).
void gather_block(std::span<const LayerKv> layers, int64_t index, Block& out);

// Copies `block` into block `index` of `layers` (dense, writable: checked with kWrite). Layers
// the block holds quantized are dequantized straight into the destination.
Status scatter_block(const Block& block, std::span<const LayerKv> layers, int64_t index);

// One-block views over a dense block's bytes in block order (layer 0 K, layer 0 V, layer 1 K, ...;
// what Block::data() holds for a dense block and what the C ABI exchanges). `base` must hold
// layout.dense_block_bytes().
std::vector<LayerKv> dense_block_views(const KvLayout& layout, const uint8_t* base, bool read_only);

}  // namespace kvtier
