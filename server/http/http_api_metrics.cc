// HttpApi's numbers for the exporters: /v1/stats (the tiers and every metric as JSON) and the
// HTTP door's own counters. The routes and connections are in http_api.cc.
#include <nlohmann/json.hpp>

#include "base/metrics/metrics_exporters.h"
#include "server/http/http_api.h"

namespace kvtier {

using nlohmann::json;

std::string HttpApi::stats_json() {
  CacheStack& stack = service_.stack();
  json tiers = json::array();
  for (const auto& t : stack.cache().tiers()) {
    tiers.push_back({{"name", t->name()},
                     {"blocks", t->block_count()},
                     {"used_bytes", t->used_bytes()},
                     {"capacity_bytes", t->capacity_bytes()}});
  }
  JsonMetricsWriter w;
  stack.cache().visit_metrics(w);
  service_.visit_metrics(w);
  visit_metrics(w);
  for (const auto& source : metric_sources_) source(w);
  return json{{"layout", stack.layout().name},
              {"block_bytes", stack.layout().dense_block_bytes()},
              {"tiers", tiers},
              {"metrics", w.json()}}
      .dump();  // our own names and numbers only
}

void HttpApi::visit_metrics(MetricVisitor& v) const {
  for (const auto& [route, h] : latency_) {
    v.histogram("kvtier_http_request_seconds", "Time spent in a route's handler", {{"route", route}},
                h->snapshot());
  }
  {
    std::lock_guard lock(counts_mu_);
    for (const auto& [key, n] : counts_) {
      v.counter("kvtier_http_requests_total", "Requests answered, by route and status",
                {{"route", key.first}, {"code", std::to_string(key.second)}}, n);
    }
  }
  v.counter("kvtier_http_handler_exceptions_total", "Handlers that threw (answered 500)", {},
            handler_exceptions_.value());
  const ListenerMetrics& l = listener_.metrics();
  v.counter("kvtier_http_connections_total", "Connections accepted", {}, l.connections.accepted.value());
  v.gauge("kvtier_http_connections_open", "Connections being served (one thread each)", {},
          static_cast<double>(l.connections.open.value()));
  v.gauge("kvtier_http_connections_waiting", "Connections waiting for a thread (--threads reached)", {},
          static_cast<double>(l.connections.waiting.value()));
  v.counter("kvtier_http_connections_waited_total", "Connections that found --threads busy and waited", {},
            l.connections.waited.value());
  v.counter("kvtier_http_thread_failures_total", "Connections the OS gave no thread (served by a running one)",
            {}, l.connections.thread_failures.value());
  v.counter("kvtier_http_connections_refused_total", "Connections refused: the client address had its cap open",
            {{"reason", "per_client_cap"}}, l.refused_per_client.value());
  v.counter("kvtier_http_accept_failures_total", "accept() failures other than interruptions (out of descriptors or memory)",
            {}, l.accept_failures.value());
  v.counter("kvtier_http_idle_closed_total", "Connections closed after --idle-timeout without a request", {},
            idle_closed_.value());
  v.counter("kvtier_http_timeouts_total", "Connections closed: a request or a reply's write outlasted --request-timeout",
            {}, timeouts_.value());
  v.counter("kvtier_http_tls_handshake_failures_total", "TLS connections whose handshake failed or timed out", {},
            tls_failures_.value());
}

}  // namespace kvtier
