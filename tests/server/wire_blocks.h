// Blocks as a client of kvtierd makes them: real prefix hashes of a prompt in a namespace, KV of
// the layout's dtypes (with the special values serializers get wrong), encoded as documents.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/memory/bytes.h"
#include "serialize/block.h"
#include "tests/support/test_blocks.h"

namespace kvtier::testing {

struct WireBlock {
  BlockHash hash;
  Bytes document;
};

std::vector<uint32_t> prompt(uint32_t seed, size_t n);
// Every full block of `tokens` hashed with SHA-256 in namespace `ns` of `layout`.
std::vector<WireBlock> prompt_blocks(std::shared_ptr<const KvLayout> layout, const std::string& ns,
                                     const std::vector<uint32_t>& tokens, Values values = Values::kWithSpecials);
// The tiny preset with every layer of `dtype`, as a JSON file under `dir`; returns its path.
std::string write_layout_file(const std::string& dir, DType dtype);
std::shared_ptr<const KvLayout> tiny_layout(DType dtype);

}  // namespace kvtier::testing
