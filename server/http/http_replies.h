// How the HTTP door answers: JSON bodies (every error one {"error": {"code", "message"}} with a
// status that says whose fault it is), and block documents streamed from the bytes the tiers
// hold, never copied into a body first (a block is megabytes).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "base/status.h"
#include "serialize/block_hash.h"
#include "server/block_service.h"

namespace kvtier {

void send_json(httplib::Response& res, int status, const nlohmann::json& body);
void send_error(httplib::Response& res, const Status& st);
// An early answer, sent before the body was read: the connection closes, or the body's unread
// bytes would be taken for the next request.
void send_refusal(httplib::Response& res, int status, const char* code, const std::string& message);

// A response body made of pieces written one after another: small strings it owns and the KV
// bytes of blocks it keeps alive.
class BodyPieces {
 public:
  void add(std::string text);
  void add(const BlockDocumentParts& doc);
  uint64_t size() const { return ends_.empty() ? 0 : ends_.back(); }
  // Writes from `offset` to the end of the piece holding it; the sink calls again for the rest.
  bool write_from(uint64_t offset, httplib::DataSink& sink) const;

 private:
  void add_span(const char* p, size_t n);
  std::vector<std::unique_ptr<std::string>> texts_;  // stable addresses as the vector grows
  std::vector<BlockRef> blocks_;
  std::vector<std::pair<const char*, size_t>> pieces_;
  std::vector<uint64_t> ends_;  // cumulative end offset of each piece
};

void send_pieces(httplib::Response& res, std::shared_ptr<const BodyPieces> body, const char* type);

// The block hash a route's path names (its first match).
Result<BlockHash> path_hash(const httplib::Request& req);

}  // namespace kvtier
