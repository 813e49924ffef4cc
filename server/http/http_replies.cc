#include "server/http/http_replies.h"

#include <algorithm>

#include "server/http/request_json.h"
#include "server/status_codes.h"

namespace kvtier {

void send_json(httplib::Response& res, int status, const nlohmann::json& body) {
  res.status = status;
  res.set_content(json_text(body), "application/json");
}

void send_error(httplib::Response& res, const Status& st) {
  send_json(res, http_status_for(st.code()), error_json(error_code_for(st.code()), st.message()));
}

void send_refusal(httplib::Response& res, int status, const char* code, const std::string& message) {
  res.set_header("Connection", "close");
  send_json(res, status, error_json(code, message));
}

void BodyPieces::add(std::string text) {
  texts_.push_back(std::make_unique<std::string>(std::move(text)));
  add_span(texts_.back()->data(), texts_.back()->size());
}

void BodyPieces::add(const BlockDocumentParts& doc) {
  add(doc.head);
  blocks_.push_back(doc.block);
  add_span(reinterpret_cast<const char*>(doc.block->data().data()), doc.block->data().size());
}

bool BodyPieces::write_from(uint64_t offset, httplib::DataSink& sink) const {
  const size_t i = std::upper_bound(ends_.begin(), ends_.end(), offset) - ends_.begin();
  const uint64_t start = ends_[i] - pieces_[i].second;
  return sink.write(pieces_[i].first + (offset - start), ends_[i] - offset);
}

void BodyPieces::add_span(const char* p, size_t n) {
  if (n == 0) return;
  pieces_.emplace_back(p, n);
  ends_.push_back(size() + n);
}

void send_pieces(httplib::Response& res, std::shared_ptr<const BodyPieces> body, const char* type) {
  res.set_content_provider(body->size(), type, [body](size_t offset, size_t, httplib::DataSink& sink) {
    return body->write_from(offset, sink);
  });
}

Result<BlockHash> path_hash(const httplib::Request& req) {
  auto h = BlockHash::from_hex(req.matches[1].str());
  if (!h.ok()) return invalid_argument("the path's block hash: " + h.status().message());
  return *h;
}

}  // namespace kvtier
