// Writes a seed corpus for fuzz_block_codec: valid frames (every codec) and bare documents of
// every fuzz layout, each prefixed with the selector byte the target reads.
#include <fstream>
#include <iostream>
#include <string>

#include "serialize/format/block_codec.h"
#include "tests/fuzz/fuzz_layouts.h"
#include "tests/support/test_blocks.h"

using namespace kvtier;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: fuzz_seed_writer DIR\n";
    return 2;
  }
  const auto reg = fuzz::make_registry();
  int n = 0;
  for (const auto& layout : reg->all()) {
    for (FrameCodec c : {FrameCodec::kNone, FrameCodec::kLz4, FrameCodec::kLz4Shuffle}) {
      Block b = testing::make_block(layout, n, testing::Values::kKvLike);
      Bytes frame{1}, doc{0};
      Bytes body;
      if (!BlockCodec(c).encode(b, body).ok() || !BlockCodec::encode_document(b, doc).ok()) return 1;
      frame.insert(frame.end(), body.begin(), body.end());
      std::ofstream(std::string(argv[1]) + "/frame-" + std::to_string(n), std::ios::binary)
          .write(reinterpret_cast<const char*>(frame.data()), frame.size());
      std::ofstream(std::string(argv[1]) + "/doc-" + std::to_string(n), std::ios::binary)
          .write(reinterpret_cast<const char*>(doc.data()), doc.size());
      ++n;
    }
  }
  return 0;
}
