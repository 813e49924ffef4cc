#include "tests/server/raw_requests.h"

#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "server/cli/kvtier_client.h"
#include "tests/server/server_process.h"

namespace kvtier::testing {

double metric_value(KvtierClient& c, const std::string& name, const std::string& label_key,
                    const std::string& label_value) {
  auto stats = c.stats();
  if (!stats.ok() || !(*stats)["metrics"].contains(name)) return -1;
  for (const auto& sample : (*stats)["metrics"][name]) {
    if (label_key.empty() || sample["labels"].value(label_key, "") == label_value) return sample["value"].get<double>();
  }
  return -1;
}

int binary_port(int http_port) {
  KvtierClient c("127.0.0.1", http_port);
  auto r = c.raw("GET", "/healthz");
  nlohmann::json j = nlohmann::json::parse(r.body, nullptr, false);
  return j.is_object() && j.contains("binary_port") ? j["binary_port"].get<int>() : 0;
}

bool read_all(int fd, void* p, size_t n) {
  auto* b = static_cast<uint8_t*>(p);
  while (n > 0) {
    const ssize_t got = ::recv(fd, b, n, 0);
    if (got <= 0) return false;
    b += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

uint64_t little_endian(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

std::string request_bytes(uint8_t op, const std::string& ns, const BlockHash& hash, const std::string& body) {
  std::string r = "KVT1";
  r += static_cast<char>(op);
  r += '\0';
  for (int i = 0; i < 2; ++i) r += static_cast<char>(ns.size() >> (8 * i));
  for (int i = 0; i < 8; ++i) r += static_cast<char>(body.size() >> (8 * i));
  r.append(reinterpret_cast<const char*>(hash.bytes.data()), 32);
  return r + ns + body;
}

RawReply read_reply(int fd) {
  uint8_t head[16];
  if (!read_all(fd, head, sizeof(head))) return {};
  EXPECT_EQ(std::string(reinterpret_cast<char*>(head), 4), "KVT1");
  RawReply r{static_cast<int>(little_endian(head + 4, 2)), little_endian(head + 8, 8), ""};
  if (r.body_bytes != ~0ull) {
    r.body.resize(r.body_bytes);
    if (!read_all(fd, r.body.data(), r.body.size())) return {};
  }
  return r;
}

int http_status_of(const std::string& text) {
  if (text.rfind("HTTP/1.", 0) != 0 || text.size() < 12) return 0;
  return std::atoi(text.c_str() + 9);
}

RawHttpReply raw_http(int port, const std::string& request, int timeout_s) {
  const int fd = connect_loopback(port, timeout_s);
  if (fd < 0) return {};
  RawHttpReply r;
  if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size())) {
    char buf[4096];
    ssize_t n;
    while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) {
      r.text.append(buf, static_cast<size_t>(n));
      // One answer is enough: stop at the end of its body when it says how long that is.
      const size_t end = r.text.find("\r\n\r\n");
      const size_t cl = r.text.find("Content-Length: ");
      if (end != std::string::npos && cl != std::string::npos && cl < end &&
          r.text.size() >= end + 4 + std::stoull(r.text.substr(cl + 16))) {
        break;
      }
    }
  }
  ::close(fd);
  r.status = http_status_of(r.text);
  return r;
}

}  // namespace kvtier::testing
