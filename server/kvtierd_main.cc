// kvtierd: the tiered KV cache as a service. Opens the tiers the flags describe (GPU with
// --gpu-memory, RAM, SSD with --ssd-cache-dir), serves the HTTP API, and on SIGINT/SIGTERM stops
// accepting, finishes in-flight requests, writes what only RAM holds to the SSD and drains the
// spill queue (bounded by --shutdown-timeout, saying what was left), then closes RocksDB.
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <thread>

#include <nlohmann/json.hpp>

#include "base/byte_size.h"
#include "base/elapsed.h"
#include "base/log.h"
#include "base/memory/memory_policy.h"
#include "engine/vulkan/vulkan_context.h"
#include "server/block_service.h"
#include "server/http/http_api.h"
#include "server/net/tls_context.h"
#include "server/server_options.h"
#include "server/wire/wire_server.h"

using namespace kvtier;

namespace {

// The exit status of a shutdown that could not write every block it held (docs/operations.md).
constexpr int kExitBlocksLost = 3;

std::string describe_tiers(CacheStack& stack) {
  std::string out;
  for (const auto& t : stack.cache().tiers()) {
    out += (out.empty() ? "" : " -> ") + std::string(t->name()) + " " + format_byte_size(t->capacity_bytes());
  }
  return out;
}

// Blocks SIGINT/SIGTERM in every thread (call before any is started); one thread waits for them.
sigset_t block_shutdown_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

// Every connection is a descriptor, and the soft limit is often 1024: a few hundred idle clients
// would make accept() fail. Raise it to the hard limit, as servers do.
void raise_descriptor_limit(int connections) {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return;
  if (lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &lim) != 0) getrlimit(RLIMIT_NOFILE, &lim);
  }
  if (lim.rlim_cur < static_cast<rlim_t>(connections) + 256) {
    spdlog::warn("open files limited to {}: fewer than --threads {} connections can be accepted", lim.rlim_cur,
                 connections);
  }
}

int serve(const ServerOptions& o) {
  const sigset_t signals = block_shutdown_signals();  // before the tiers start their threads
  raise_descriptor_limit(o.threads);
  std::unique_ptr<VulkanContext> vulkan;
  CacheStackOptions stack_options = cache_stack_options(o);
  if (o.gpu_memory > 0) {
    auto ctx = VulkanContext::create();
    if (!ctx.ok()) {
      spdlog::error("--gpu-memory {} needs a Vulkan device: {}", format_byte_size(o.gpu_memory),
                    ctx.status().to_string());
      return 1;
    }
    vulkan = std::move(ctx).value();
    stack_options.vulkan = vulkan.get();
  }
  for (const std::string& dir : o.ssd_cache_dirs) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    const auto space = std::filesystem::space(dir, ec);
    const uint64_t share = o.ssd_capacity / o.ssd_cache_dirs.size();
    if (!ec && space.available < share) {
      spdlog::warn("--ssd-capacity gives {} to {}, more than the {} free there: writes will fail "
                   "(counted) when the disk fills before the tier does",
                   format_byte_size(share), dir, format_byte_size(space.available));
    }
  }
  auto stack = CacheStack::open(stack_options);
  if (!stack.ok()) {
    spdlog::error("cannot open the cache: {}", stack.status().to_string());
    return 1;
  }
  std::unique_ptr<BlockService> service_owner =
      o.hybrid ? std::make_unique<BlockService>(**stack, o.hash, o.max_body_memory, *o.hybrid)
               : std::make_unique<BlockService>(**stack, o.hash, o.max_body_memory);
  BlockService& service = *service_owner;
  if (o.hybrid && !service.hybrid_layout()) return 2;  // logged by the service: never serve it as a plain layout
  if (o.hybrid) {
    spdlog::info("hybrid layout {} (fingerprint {}): {} of {} layers Gated DeltaNet, {} per state snapshot",
                 o.hybrid->name(), o.hybrid->fingerprint_hex(), o.hybrid->gdn_layers(), o.hybrid->pattern().size(),
                 format_byte_size(o.hybrid->snapshot_bytes()));
  }
  std::shared_ptr<AccessLog> access_log;
  if (!o.access_log.empty()) {
    auto opened = AccessLog::open(o.access_log, o.access_log_sample);
    if (!opened.ok()) {
      spdlog::error("--access-log: {}", opened.status().message());
      return 2;
    }
    access_log = std::move(opened).value();
    spdlog::info("access log: {} of requests to {}", o.access_log_sample,
                 o.access_log == "-" ? "stderr" : o.access_log);
  }
  HttpApi api(service, {o.tenants, o.threads, 0, o.tls_cert, o.tls_key, o.idle_timeout_s,
                        o.max_connections_per_client, o.request_timeout_s, access_log});
  if (!api.status().ok()) {
    spdlog::error("{}", api.status().message());
    return 2;
  }
  auto port = api.bind(o.host, o.port);
  if (!port.ok()) {
    spdlog::error("{}", port.status().to_string());
    return 1;
  }
  std::unique_ptr<WireServer> wire;
  if (o.binary_port) {
    std::shared_ptr<const TlsContext> tls;
    if (!o.tls_cert.empty()) {
      auto loaded = TlsContext::load(o.tls_cert, o.tls_key);  // HttpApi checked these files already
      if (!loaded.ok()) {
        spdlog::error("{}", loaded.status().message());
        return 2;
      }
      tls = std::move(loaded).value();
    }
    wire = std::make_unique<WireServer>(
        service, WireServerOptions{o.tenants, o.threads, o.max_connections_per_client,
                                   std::chrono::seconds(o.idle_timeout_s), std::chrono::seconds(o.request_timeout_s), 0,
                                   tls});
    const int wanted = *o.binary_port >= 0 ? *o.binary_port : (o.port == 0 ? 0 : *port + 1);
    auto bound = wire->bind(o.host, wanted);
    if (!bound.ok()) {
      spdlog::error("{} (--binary-port off turns it off)", bound.status().message());
      return 1;
    }
    api.offer_binary_port(*bound, tls != nullptr);
    api.add_metrics([w = wire.get()](MetricVisitor& v) { w->visit_metrics(v); });
    spdlog::info("binary block protocol on {}:{}{}", o.host, *bound, tls ? " (TLS)" : "");
  }
  if (!o.tenants && o.host != "127.0.0.1" && o.host != "localhost" && o.host != "::1") {
    spdlog::warn("listening on {} without --api-key or --api-keys: anyone who can reach it can read and write blocks",
                 o.host);
  }
  if (o.tls_cert.empty() && o.host != "127.0.0.1" && o.host != "localhost" && o.host != "::1") {
    spdlog::warn("listening on {} without --tls-cert: keys and blocks cross the network in clear text", o.host);
  }
  if (o.tenants && !o.api_keys_file.empty()) {
    spdlog::info("auth: {} keys from {}, {} namespaces with a RAM quota", o.tenants->key_count(), o.api_keys_file,
                 o.tenants->quotas().size());
  }
  spdlog::info("layout {} ({} per block), hash {}, tiers: {}", o.resolved_layout->name,
               format_byte_size(o.resolved_layout->dense_block_bytes()), hash_algorithm_name(o.hash),
               describe_tiers(**stack));
  // Printed whatever the log level: supervisors and tests wait for this line.
  const std::string url = std::string(o.tls_cert.empty() ? "http" : "https") + "://" + o.host + ":" + std::to_string(*port);
  if (o.log_format == LogFormat::kJson) {
    std::printf("%s\n", nlohmann::json::object({{"msg", "kvtierd: listening on " + url}, {"url", url}}).dump().c_str());
  } else {
    std::printf("kvtierd: listening on %s\n", url.c_str());
  }
  std::fflush(stdout);

  std::atomic<bool> serving{true};
  std::thread waiter([&] {
    name_this_thread("kvtierd-signal");
    int sig = 0;
    sigwait(&signals, &sig);
    if (!serving) return;  // woken by serve() itself: the listener already stopped
    spdlog::info("{}: no new connections; finishing requests in flight", sig == SIGINT ? "SIGINT" : "SIGTERM");
    api.stop();
    if (wire) wire->stop();
  });
  std::thread wire_thread;
  if (wire) {
    wire_thread = std::thread([&] {
      name_this_thread("kvtierd-wire");
      wire->run();
    });
  }
  const bool served = api.run();
  if (wire) {
    wire->stop();  // the HTTP listener failed on its own: this one stops with it
    wire_thread.join();
  }
  if (serving.exchange(false) && !served) {
    // The listener failed on its own: wake the signal thread (it would wait forever) and still
    // shut down cleanly, so nothing queued for the SSD is lost.
    spdlog::error("the HTTP listener stopped unexpectedly; shutting down");
    pthread_kill(waiter.native_handle(), SIGTERM);
  }
  waiter.join();

  const auto t0 = std::chrono::steady_clock::now();
  const auto deadline = t0 + o.shutdown_timeout;
  size_t unwritten = 0;
  if (o.persist_on_shutdown && (*stack)->ssd()) {
    const CacheStack::Persisted p = (*stack)->persist_to_ssd(deadline);
    unwritten = p.not_kept();
    log_persisted("shutdown", p);
  }
  const CacheStack::Dropped dropped = (*stack)->close();
  const double s = seconds_since(t0);
  spdlog::info("stopped {} in {:.2f} s", served ? "cleanly" : "after a listener failure", s);
  if (!served) return 1;
  // A shutdown that lost blocks this host held says so to whatever supervises it
  // (docs/operations.md); the remote tier's write-behind is a cache shared with others, not this
  // host's to lose.
  return unwritten + dropped.ssd > 0 ? kExitBlocksLost : 0;
}

}  // namespace

int main(int argc, char** argv) {
  keep_freed_block_memory();
  ParsedCommandLine cl = parse_server_command_line(argc, argv, std::cout, std::cerr);
  if (!cl.options) return cl.exit_code;
  init_logging(cl.options->log_level, cl.options->log_format);
  name_this_thread("kvtierd");
  return serve(*cl.options);
}
