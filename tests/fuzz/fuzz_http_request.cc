// libFuzzer target for kvtierd's HTTP door: bytes of one connection (method, path, query, headers,
// JSON or block bodies, several requests in a row) through cpp-httplib's parser and kvtierd's real
// handlers and BlockService. A crash, a sanitizer report, a handler that threw (counted, answered
// 500) or any 500 answer fails the run: every client mistake has a 4xx of its own.
#include <cctype>
#include <cstdlib>
#include <string_view>

#include "tests/fuzz/fuzz_server_env.h"

using namespace kvtier;

namespace {

// The value of header `name` (case-insensitive) in `head`, or "".
std::string_view header(std::string_view head, std::string_view name) {
  for (size_t at = head.find("\r\n"); at != std::string_view::npos; at = head.find("\r\n", at + 2)) {
    const std::string_view line = head.substr(at + 2, head.find("\r\n", at + 2) - (at + 2));
    if (line.size() <= name.size() || line[name.size()] != ':') continue;
    bool same = true;
    for (size_t i = 0; i < name.size() && same; ++i) same = std::tolower(line[i]) == std::tolower(name[i]);
    if (same) return line.substr(name.size() + 2);
  }
  return {};
}

// Whether any response in `out` has status 500. Responses are read one after another (status
// line, headers, then a Content-Length or chunked body), so a request's own bytes echoed in an
// error message ("last read: 'HTTP/1.1 500 ...'") are not taken for a status line.
bool any_500(std::string_view out) {
  size_t at = 0;
  while (at < out.size()) {
    if (out.substr(at, 9) != "HTTP/1.1 ") return false;  // cut off: what came is all there is
    if (out.substr(at + 9, 4) == "500 ") return true;
    const size_t head_end = out.find("\r\n\r\n", at);
    if (head_end == std::string_view::npos) return false;
    const std::string_view head = out.substr(at, head_end - at);
    at = head_end + 4;
    if (header(head, "Transfer-Encoding") == "chunked") {
      while (true) {
        const size_t line_end = out.find("\r\n", at);
        if (line_end == std::string_view::npos) return false;
        const size_t n = std::strtoull(std::string(out.substr(at, line_end - at)).c_str(), nullptr, 16);
        at = line_end + 2 + n + 2;
        if (n == 0 || at > out.size()) break;
      }
    } else {
      at += std::strtoull(std::string(header(head, "Content-Length")).c_str(), nullptr, 10);
    }
  }
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::ServerEnv env;
  const std::string out = fuzz::serve_bytes(data, size, [](int fd) { env.http->serve(fd); });
  if (any_500(out)) std::abort();
  return 0;
}
