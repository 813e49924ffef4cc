// What the server fuzz targets share: a kvtierd without sockets of its own (the tiny layout, a
// RAM tier, both doors over one BlockService) and a way to hand it one connection's bytes. The
// input is written into one end of a socket pair and the door serves the other end on this thread,
// through the real parser and handlers; the answer is collected for the target's checks.
#pragma once

#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include <spdlog/spdlog.h>

#include "cache/cache_stack.h"
#include "serialize/kv_layout.h"
#include "server/block_service.h"
#include "server/http/http_api.h"
#include "server/wire/wire_server.h"

namespace kvtier::fuzz {

struct ServerEnv {
  ServerEnv() {
    spdlog::set_level(spdlog::level::off);  // every refusal is logged; millions of inputs are refused
    CacheStackOptions o;
    o.layout = std::make_shared<const KvLayout>(*layout_preset("tiny"));
    o.ram.capacity_bytes = 64ull << 20;
    auto s = CacheStack::open(o);
    if (!s.ok()) std::abort();
    stack = std::move(s).value();
    service = std::make_unique<BlockService>(*stack, HashAlgorithm::kSha256, 64ull << 20);
    HttpApiOptions h;
    h.idle_timeout_s = 1;
    h.request_timeout_s = 1;
    http = std::make_unique<HttpApi>(*service, h);
    WireServerOptions w;
    w.idle_timeout = std::chrono::milliseconds(200);
    w.request_timeout = std::chrono::milliseconds(500);
    wire = std::make_unique<WireServer>(*service, w);
  }
  std::unique_ptr<CacheStack> stack;
  std::unique_ptr<BlockService> service;
  std::unique_ptr<HttpApi> http;
  std::unique_ptr<WireServer> wire;
};

// Serves `data` as one connection's bytes with `serve` (a door's serve(fd)); returns what the door
// wrote back (the first 1 MiB: enough for the checks).
template <typename Serve>
std::string serve_bytes(const uint8_t* data, size_t size, Serve&& serve) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) std::abort();
  std::string out;
  std::thread client([&] {
    size_t sent = 0;
    while (sent < size) {
      const ssize_t n = ::send(sv[0], data + sent, size - sent, MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += static_cast<size_t>(n);
    }
    ::shutdown(sv[0], SHUT_WR);
    char buf[65536];
    ssize_t n;
    while ((n = ::recv(sv[0], buf, sizeof(buf), 0)) > 0) {
      if (out.size() < (1u << 20)) out.append(buf, static_cast<size_t>(n));
    }
  });
  serve(sv[1]);
  ::close(sv[1]);
  client.join();
  ::close(sv[0]);
  return out;
}

}  // namespace kvtier::fuzz
