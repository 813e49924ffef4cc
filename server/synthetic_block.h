// Blocks with made-up KV for `kvtier bench` and server_bench: the shapes and dtypes of a real
// layout, finite values (never NaN or inf, so RAM quantization treats them as it would real KV),
// under a real prefix identity so the server accepts them.
#pragma once

#include <memory>

#include "serialize/block.h"

namespace kvtier {

Block synthetic_block(std::shared_ptr<const KvLayout> layout, BlockIdentity id, uint64_t seed);

}  // namespace kvtier
