// Requests written byte by byte, as a hostile or hand-rolled client sends them: binary frames laid
// out as docs/wire-protocol.md says, and HTTP requests as raw text (paths and headers that no
// well-behaved client library would send). For the tests of both of kvtierd's doors.
#pragma once

#include <cstdint>
#include <string>

#include "serialize/block_hash.h"

namespace kvtier {
class KvtierClient;
}

namespace kvtier::testing {

// A metric's value from /v1/stats (the sample with that label, or the first), or -1 if absent.
double metric_value(KvtierClient& c, const std::string& name, const std::string& label_key = "",
                    const std::string& label_value = "");

// The binary port kvtierd offers in /healthz, or 0.
int binary_port(int http_port);

bool read_all(int fd, void* p, size_t n);
uint64_t little_endian(const uint8_t* p, int bytes);

// A binary request frame: header, namespace, body.
std::string request_bytes(uint8_t op, const std::string& ns, const BlockHash& hash, const std::string& body);

struct RawReply {
  int status = 0;  // 0: the connection closed before a whole reply
  uint64_t body_bytes = 0;
  std::string body;
};
// Reads one binary reply (16-byte header, then the body unless it streams).
RawReply read_reply(int fd);

// Sends `request` to the HTTP port as it is and reads the answer until the server closes or
// `timeout_s` passes; status 0 when nothing (or not HTTP) came back.
struct RawHttpReply {
  int status = 0;
  std::string text;  // the whole answer, headers included
};
RawHttpReply raw_http(int port, const std::string& request, int timeout_s = 10);
// The status line's code in an HTTP answer, or 0.
int http_status_of(const std::string& text);

}  // namespace kvtier::testing
