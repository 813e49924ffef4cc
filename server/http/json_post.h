// A POST route whose body is JSON, read whatever Content-Type the client sent: `curl -d` says
// form-urlencoded, and Debian's cpp-httplib would cap such a body at 8 KiB (a 413). The body is
// refused from its Content-Length before a byte is read when it is over the limit, and read into
// one buffer leased from --max-body-memory (a 503 with Retry-After when the budget has no room);
// every early answer closes the connection, or the unread bytes would be taken for the next
// request.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "base/metrics/metrics.h"
#include "server/net/body_budget.h"

namespace httplib {
class Server;
struct Response;
}  // namespace httplib

namespace kvtier {

// `lease` holds the body's bytes; a handler grows it by what the body expands to before it builds
// that (a prompt's tokens and its reply).
using JsonPostHandler = std::function<void(const std::string& body, BodyBudget::Lease& lease, httplib::Response&)>;

// Adds the route to `s`; `latency` observes each request's time in it.
void add_json_post(httplib::Server& s, const std::string& pattern, Histogram* latency, BodyBudget& budget,
                   uint64_t max_body, JsonPostHandler handler);

}  // namespace kvtier
