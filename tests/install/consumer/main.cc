// Stores a block through the installed C++ front door and reads it back.
#include <kvtier/inprocess/embedded_cache.h>

#include <cstdio>
#include <vector>

int main() {
  kvtier::EmbeddedCacheOptions options;
  options.layout = "tiny";
  auto cache = kvtier::EmbeddedCache::open(options);
  if (!cache.ok()) {
    std::fprintf(stderr, "open: %s\n", cache.status().to_string().c_str());
    return 1;
  }
  std::vector<uint32_t> tokens(16, 7);
  std::vector<uint8_t> in((*cache)->block_bytes()), out(in.size());
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint8_t>(i * 13);
  auto stored = (*cache)->store_bytes({tokens}, std::nullopt, in);
  auto found = stored.ok() ? (*cache)->load_block_bytes(stored->hash, tokens, out) : kvtier::Result<bool>(stored.status());
  if (!found.ok() || !*found || in != out) {
    std::fprintf(stderr, "round trip failed\n");
    return 1;
  }
  std::printf("c++ ok %s\n", stored->hash.hex().c_str());
  return 0;
}
