// libFuzzer target for kvtierd's HTTP door: bytes of one connection (method, path, query, headers,
// JSON or block bodies, several requests in a row) through cpp-httplib's parser and kvtierd's real
// handlers and BlockService. A crash, a sanitizer report, a handler that threw (counted, answered
// 500) or any 500 answer fails the run: every client mistake has a 4xx of its own.
#include <string_view>

#include "tests/fuzz/fuzz_server_env.h"

using namespace kvtier;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::ServerEnv env;
  const std::string out = fuzz::serve_bytes(data, size, [](int fd) { env.http->serve(fd); });
  if (out.find("HTTP/1.1 500 ") != std::string::npos) std::abort();
  return 0;
}
