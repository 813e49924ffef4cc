// Placeholder for kvtierd until the server exists: round-trips one Llama-3-8B block through the
// block codec and says what it did.
#include <cstring>
#include <iostream>
#include <random>

#include "base/byte_size.h"
#include "serialize/block_codec.h"

using namespace kvtier;

int main() {
  LayoutRegistry registry;
  auto layout = *registry.add(*layout_preset("llama-3-8b"));
  BlockIdentity id;
  for (uint32_t t = 0; t < 16; ++t) id.token_ids.push_back(1000 + t);
  id.namespace_id = "demo";
  Block block = Block::dense(layout, id);
  std::mt19937 rng(1);
  auto data = block.mutable_data();
  for (size_t i = 0; i < data.size(); i += 2) {
    uint16_t v = f32_to_bf16(std::uniform_real_distribution<float>(-2, 2)(rng));
    std::memcpy(data.data() + i, &v, 2);
  }
  for (FrameCodec c : {FrameCodec::kNone, FrameCodec::kLz4Shuffle}) {
    BlockCodec codec(c);
    Bytes frame;
    if (Status s = codec.encode(block, frame); !s.ok()) {
      std::cerr << s.to_string() << "\n";
      return 1;
    }
    auto back = codec.decode(frame, registry);
    if (!back.ok()) {
      std::cerr << back.status().to_string() << "\n";
      return 1;
    }
    bool same = std::memcmp(back->data().data(), block.data().data(), block.data().size()) == 0;
    std::cout << "block " << format_byte_size(block.data().size()) << " (" << layout->name
              << ", bf16) -> " << frame_codec_name(c) << " frame " << format_byte_size(frame.size())
              << " -> decoded " << (same ? "bit-exact" : "MISMATCH") << "\n";
    if (!same) return 1;
  }
  return 0;
}
