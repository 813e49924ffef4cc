// The state document: a hybrid model's snapshot of every Gated DeltaNet layer's recurrent state
// and conv window, taken at the end of one block of a prompt, as a safetensors file
// like the block document (format/block_document.h), so any safetensors reader opens it:
//
//   offset        size  field
//   0             8     N: u64 length of the JSON header (little-endian)
//   8             N     JSON header, padded with spaces to a multiple of 8 bytes
//   8 + N         D     data: the tensors' raw f32 bytes, back to back, in the pattern's order
//
//   tensors    layers.{i}.state: F32 [heads, d_k, d_v]; layers.{i}.conv_window: F32 [conv_channels,
//              conv_width - 1] — for every GDN layer i (its index in the whole pattern), state
//              before window, layers in order
//   metadata   format "kvtier.state.v1"; hash (64 hex digits: the chain hash of the block the
//              snapshot ends at, which keys it); tokens (decimal: the prefix length it summarises);
//              layout_fingerprint (16 hex digits: HybridLayout::fingerprint); namespace
// The f32 words are stored as they are: reload is bit-exact.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "base/memory/aligned_buffer.h"
#include "base/memory/bytes.h"
#include "base/status.h"
#include "serialize/block_hash.h"
#include "serialize/hybrid_layout.h"

namespace kvtier {

inline constexpr const char* kStateDocumentFormat = "kvtier.state.v1";

struct StateSnapshot {
  BlockHash at;          // the chain hash of the block it ends at
  uint64_t tokens = 0;   // the prefix it summarises
  std::string ns;        // the namespace, as block documents name it
  AlignedBuffer data;    // layout.snapshot_bytes(): per GDN layer, state then window, f32
};

// Appends the document of `snapshot` (whose data must be layout.snapshot_bytes()) to `out`.
Status encode_state_document(const HybridLayout& layout, const StateSnapshot& snapshot, Bytes& out);

// Parses and checks a document against `layout`: lengths, JSON, format, fingerprint, every tensor
// name, dtype, shape and offset (in order, covering the data exactly), the hash's encoding. Any
// failure is a kCorruption with the reason; nothing partial is returned.
Result<StateSnapshot> decode_state_document(std::span<const uint8_t> document, const HybridLayout& layout);

}  // namespace kvtier
