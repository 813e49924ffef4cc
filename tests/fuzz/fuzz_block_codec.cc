// libFuzzer target for the bytes kvtier reads back from disk and the network: the frame and the
// block document. The first input byte picks the entry point, because checksums keep mutated
// frames from ever reaching the document parser. Whatever decodes must re-encode and decode to
// the same bytes.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "serialize/format/block_codec.h"
#include "tests/fuzz/fuzz_layouts.h"

using namespace kvtier;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::unique_ptr<LayoutRegistry> registry = fuzz::make_registry();
  if (size == 0) return 0;
  const std::span<const uint8_t> input(data + 1, size - 1);
  static BlockCodec codec;
  Result<Block> block = (data[0] & 1) ? codec.decode(input, *registry)
                                      : decode_block_document(input, *registry);
  if (!block.ok()) return 0;
  Bytes doc;
  if (!BlockCodec::encode_document(*block, doc).ok()) std::abort();
  Result<Block> again = decode_block_document(doc, *registry);
  if (!again.ok() || again->data().size() != block->data().size() ||
      std::memcmp(again->data().data(), block->data().data(), block->data().size()) != 0 ||
      !(again->identity() == block->identity())) {
    std::abort();
  }
  return 0;
}
