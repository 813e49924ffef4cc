// libFuzzer target for kvtierd's binary port: bytes of one connection (48-byte headers, namespaces,
// bodies, several frames in a row) through the real WireServer session and BlockService. A crash,
// a sanitizer report or a 500 reply fails the run.
#include "server/wire/wire_format.h"
#include "tests/fuzz/fuzz_server_env.h"

using namespace kvtier;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::ServerEnv env;
  const std::string out = fuzz::serve_bytes(data, size, [](int fd) { env.wire->serve(fd); });
  // Replies follow one another; a streamed batch GET's items cannot be told from headers, so
  // only the replies up to the first stream are read.
  for (size_t at = 0; at + wire::kResponseHeaderBytes <= out.size();) {
    auto h = wire::decode_response(std::span<const uint8_t, wire::kResponseHeaderBytes>(
        reinterpret_cast<const uint8_t*>(out.data() + at), wire::kResponseHeaderBytes));
    if (!h.ok()) std::abort();  // the server wrote something that is not a reply
    if (h->status == 500) std::abort();
    if (h->body_bytes == wire::kStreamedBody) break;
    at += wire::kResponseHeaderBytes + h->body_bytes;
  }
  return 0;
}
