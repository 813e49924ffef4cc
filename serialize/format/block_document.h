// The block document: one Block as a safetensors file, so any safetensors reader can open a
// stored block. Layout (all integers little-endian):
//
//   offset        size  field
//   0             8     N: u64 length of the JSON header
//   8             N     JSON header, padded with spaces to a multiple of 8 bytes
//   8 + N         D     data: every tensor's raw bytes, back to back, no gaps
//
// The header maps tensor names to {"dtype", "shape", "data_offsets": [begin, end)} (offsets
// relative to the data section) plus "__metadata__", whose values are all strings (safetensors
// requires it):
//   tensors    layers.{i}.k, layers.{i}.v: dtype F32|F16|BF16, shape [block_size, kv_heads, head_dim]
//   metadata   format "kvtier.block.v1"; hash and parent_hash (64 hex digits); token_ids
//              ("1,2,3", decimal); layout_fingerprint (16 hex digits); namespace; extra_keys (a
//              JSON array of strings, as a string); dequantized_from (optional, a JSON object as
//              a string: {"3": {"bits": 4, "group_size": 64}} for each layer that was held
//              quantized and expanded before it was written).
// BF16 data are the raw 16-bit words: nothing is converted, so reload is bit-exact.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/memory/bytes.h"
#include "base/status.h"
#include "serialize/block.h"
#include "serialize/format/checksum.h"
#include "serialize/layout_registry.h"

namespace kvtier {

inline constexpr const char* kBlockDocumentFormat = "kvtier.block.v1";
// A header larger than this is rejected before it is parsed (safetensors uses the same bound).
inline constexpr uint64_t kMaxDocumentHeaderBytes = 100u << 20;

// Writing happens in two steps so the document can go straight into a frame or an I/O buffer:
// the header first (its length decides the total size), then the bytes.
// The JSON header of an all-dense `block`, padded to a multiple of 8. A block with quantized
// layers is an invalid argument here: BlockCodec dequantizes first.
Result<std::string> block_document_header(const Block& block);
inline size_t block_document_size(const Block& block, const std::string& header) {
  return 8 + header.size() + block.data().size();
}
// Writes the document (block_document_size bytes) to `dst`, feeding them to `checksum` if given.
void write_block_document(const Block& block, const std::string& header, uint8_t* dst,
                          Checksum64* checksum);
// Appends the whole document of an all-dense `block` to `out`.
Status encode_block_document(const Block& block, Bytes& out);

// Parses and checks a document against the layout its metadata names (looked up in `layouts`):
// lengths, JSON, every field's type, tensor names, dtypes and shapes against the layout, offsets
// in range, non-overlapping and covering the data exactly, token count, hash encodings. Any
// failure is a kCorruption (or kInvalidArgument for an unknown layout) with the reason; no
// partial block is returned.
//
// With `checksum`, every byte of the document is fed to it in order while the data is copied into
// the block (one pass over memory); the caller compares the digest before trusting the block.
Result<Block> decode_block_document(std::span<const uint8_t> document,
                                    const LayoutRegistry& layouts,
                                    Checksum64* checksum = nullptr);

// The same checks for a document at `offset` in `storage` whose bytes are already verified (frame
// checksum): when the document is in this writer's canonical form the block adopts `storage`
// (its tensors stay where they are: no copy); any other valid document is copied as above.
Result<Block> decode_block_document_adopting(AlignedBuffer storage, size_t offset, size_t length,
                                             const LayoutRegistry& layouts);

}  // namespace kvtier
