// WireClient: the C++ end of the binary protocol (wire_format.h), one connection, opened on the
// first call and re-opened once when the server has closed it (every op is idempotent: blocks
// are content-addressed). KvtierClient uses it for blocks when the server offers the port.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/memory/bytes.h"
#include "base/status.h"
#include "serialize/block_hash.h"
#include "server/wire/wire_format.h"
#include "server/wire/wire_stream.h"

namespace kvtier {

class TlsContext;

// Not thread-safe; one per thread.
class WireClient {
 public:
  // `tls` set: every connection is TLS, the server's certificate verified against it.
  WireClient(std::string host, int port, std::string api_key = "", std::shared_ptr<const TlsContext> tls = nullptr);
  ~WireClient();
  WireClient(const WireClient&) = delete;
  WireClient& operator=(const WireClient&) = delete;

  // true: stored (201); false: already held (200).
  Result<bool> put(const BlockHash& hash, std::span<const uint8_t> document, const std::string& ns = "");
  Result<Bytes> get(const BlockHash& hash, const std::string& ns = "");
  Result<std::vector<std::optional<Bytes>>> batch_get(std::span<const BlockHash> hashes, const std::string& ns = "");
  Status erase(const BlockHash& hash, const std::string& ns = "");
  // Whether a connection was ever opened (a server that offers a port nobody can reach: never).
  bool ever_connected() const { return ever_connected_; }

 private:
  struct Reply {
    uint16_t status = 0;
    uint64_t body_bytes = 0;
  };
  // Sends one request and reads the reply's header; the caller reads the body.
  Result<Reply> exchange(wire::Op op, const BlockHash& hash, const std::string& ns, std::span<const uint8_t> body);
  // exchange() on a fresh connection once more when the old one turned out to be closed.
  Result<Reply> exchange_with_retry(wire::Op op, const BlockHash& hash, const std::string& ns,
                                    std::span<const uint8_t> body);
  Status connect();
  void disconnect();
  // The body of an error reply as a Status (the server's JSON message).
  Status error_of(const Reply& reply);
  std::chrono::steady_clock::time_point deadline() const;

  const std::string host_;
  const int port_;
  const std::string api_key_;
  const std::shared_ptr<const TlsContext> tls_;
  int fd_ = -1;
  std::unique_ptr<WireStream> stream_;  // set while fd_ is open
  bool ever_connected_ = false;
  std::chrono::seconds timeout_{60};
};

}  // namespace kvtier
