#include "server/http/json_post.h"

#include <chrono>

#include "base/elapsed.h"
#include "server/http/http_replies.h"
#include "server/http/request_json.h"

namespace kvtier {

void add_json_post(httplib::Server& s, const std::string& pattern, Histogram* h, BodyBudget& budget,
                   uint64_t max_body, JsonPostHandler handler) {
  s.Post(pattern, [h, &budget, max_body, handler = std::move(handler)](
                      const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& read) {
    const auto t0 = std::chrono::steady_clock::now();
    // Every early answer closes the connection (send_refusal).
    auto too_large = [&](const std::string& length) {
      send_refusal(res, 413, "payload_too_large",
                   "the body is " + length + " bytes; at most " + std::to_string(max_body) + " are accepted");
    };
    if (req.is_multipart_form_data()) {
      return send_refusal(res, 415, "unsupported_media_type",
                          "send the request as a JSON body (Content-Type: application/json)");
    }
    // Refused from the header, before a byte of the body is read.
    const uint64_t declared = req.has_header("Content-Length") ? req.get_header_value<uint64_t>("Content-Length") : 0;
    if (declared > max_body) return too_large(req.get_header_value("Content-Length"));
    std::string body;
    BodyBudget::Lease lease = budget.empty();
    bool over_budget = !lease.grow(declared, "a JSON body"), over_limit = false;
    if (!over_budget) body.reserve(declared);  // one buffer of the leased size, not doublings past it
    if (!over_budget) {
      read([&](const char* data, size_t n) {
        over_limit = body.size() + n > max_body;  // a chunked body declares no length
        over_budget = !over_limit && body.size() + n > lease.bytes() && !lease.grow(n, "a JSON body");
        if (over_limit || over_budget) return false;
        body.append(data, n);
        return true;
      });
    }
    if (over_limit) return too_large("more than " + std::to_string(max_body));
    if (over_budget) {
      res.set_header("Retry-After", "1");
      return send_refusal(res, 503, "resource_exhausted", "request bodies hold all of --max-body-memory; retry");
    }
    handler(body, lease, res);
    h->observe(seconds_since(t0));
  });
}

}  // namespace kvtier
