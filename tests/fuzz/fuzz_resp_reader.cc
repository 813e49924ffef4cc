// libFuzzer target: RespReader on arbitrary bytes from a Redis node, fed in the chunk sizes the
// input's first byte picks. It must never crash, read out of bounds or allocate what a peer
// merely announced; a reply it returns must be well formed (a large string's checksum matches).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "serialize/format/checksum.h"
#include "tiers/remote/resp/resp_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t chunk = 1 + data[0] % 64;
  kvtier::RespReaderOptions o;
  o.large_string_bytes = 64;  // small, so the in-place path is reached by small inputs
  o.checksum_after = 8;
  o.max_string_bytes = 1 << 20;
  o.max_buffered_reply_bytes = 1 << 20;
  kvtier::RespReader reader(o);
  size_t at = 1;
  for (;;) {
    for (;;) {
      auto r = reader.next();
      if (!r.ok()) return 0;  // malformed: the connection would be dropped
      if (!*r) break;
      kvtier::RedisReply& reply = **r;
      if (reply.is_string() && reply.tail_checksum()) {
        const std::string_view v = reply.str();
        if (v.size() < 8 || *reply.tail_checksum() != kvtier::checksum64(v.data() + 8, v.size() - 8)) __builtin_trap();
      }
    }
    if (at == size) return 0;
    std::span<uint8_t> area = reader.write_area();
    if (area.empty()) return 0;
    const size_t n = std::min({area.size(), chunk, size - at});
    std::memcpy(area.data(), data + at, n);
    reader.wrote(n);
    at += n;
  }
}
