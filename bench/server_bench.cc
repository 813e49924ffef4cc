// server_bench: kvtierd's HTTP path on loopback, in one process (the server's code, a real
// socket, cpp-httplib on both ends).
//  1. POST /v1/lookup of a fully cached 4096-token prompt: requests/s and p50/p99 latency with
//     1 and 8 connections.
//  2. PUT and GET of Llama-3-8B blocks (2 MiB documents) in GB/s with 1 and 4 connections, over
//     HTTP, HTTPS (TLS 1.3, a self-signed EC P-256 certificate) and the binary protocol
//     (server/wire), in the clear and inside TLS, against the same bytes pushed through a loopback
//     TCP socket in the same run (inside TLS for the TLS rows).
// Medians of --reps repetitions.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include <CLI/CLI.hpp>

#include "base/byte_size.h"
#include "base/elapsed.h"
#include "base/memory/memory_policy.h"
#include "bench/harness/bench_must.h"
#include "bench/harness/bench_report.h"
#include "serialize/format/block_codec.h"
#include "server/block_service.h"
#include "server/cli/kvtier_client.h"
#include "server/http/http_api.h"
#include "server/net/tls_context.h"
#include "server/synthetic_block.h"
#include "server/wire/wire_server.h"
#include "server/wire/wire_stream.h"
#include "tests/support/self_signed_cert.h"
#include "tests/support/temp_dir.h"

using namespace kvtier;
using namespace kvtier::bench;
using Clock = std::chrono::steady_clock;

namespace {

struct Doc {
  BlockHash hash;
  Bytes bytes;
};

// The documents of a prompt's blocks, as a client would build them.
std::vector<Doc> prompt_documents(KvtierClient& c, std::shared_ptr<const KvLayout> layout, const std::string& ns,
                                  const std::vector<uint32_t>& tokens) {
  nlohmann::json found = must(c.lookup(ns, tokens));
  std::vector<Doc> docs;
  for (size_t i = 0; i < found["missing"].size(); ++i) {
    BlockIdentity id;
    id.hash = must(BlockHash::from_hex(found["missing"][i]["hash"].get<std::string>()));
    id.parent_hash = must(BlockHash::from_hex(found["missing"][i]["parent_hash"].get<std::string>()));
    id.token_ids.assign(tokens.begin() + i * layout->block_size, tokens.begin() + (i + 1) * layout->block_size);
    id.namespace_id = ns;
    Doc d{id.hash, {}};
    if (Status st = BlockCodec::encode_document(synthetic_block(layout, id, i), d.bytes); !st.ok()) die(st);
    docs.push_back(std::move(d));
  }
  return docs;
}

// The HTTP server's options for a benchmark: `threads` connections at once, over TLS when a
// certificate is given.
HttpApiOptions http_options(int threads, int idle_timeout_s, std::string tls_cert = "",
                            std::string tls_key = "") {
  HttpApiOptions o;
  o.threads = threads;
  o.tls_cert = std::move(tls_cert);
  o.tls_key = std::move(tls_key);
  o.idle_timeout_s = idle_timeout_s;
  return o;
}

std::vector<uint32_t> tokens_for(size_t n, uint32_t seed) {
  std::vector<uint32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = (seed * 7919u + static_cast<uint32_t>(i) * 104729u) % 128256u;
  return t;
}

// A loopback listening socket on a free port.
int listen_loopback(sockaddr_in& addr) {
  const int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  ::listen(lfd, 64);
  socklen_t len = sizeof(addr);
  ::getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len);
  return lfd;
}

// GB/s of `bytes_per_conn` pushed through each of `conns` loopback TCP connections at once, in
// 2 MiB writes and reads: what the kernel's socket path gives with no protocol and no cache. With
// `tls` (server, client), each connection is TLS, so the https and binary-over-TLS rows are held
// against what encryption alone allows.
double socket_copy_gbps(size_t bytes_per_conn, int conns,
                        std::pair<const TlsContext*, const TlsContext*> tls = {nullptr, nullptr}) {
  sockaddr_in addr;
  const int lfd = listen_loopback(addr);
  std::vector<std::thread> threads;
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  const auto t0 = Clock::now();
  for (int c = 0; c < conns; ++c) {
    threads.emplace_back([&] {  // reader
      const int fd = ::accept(lfd, nullptr, nullptr);
      const int one = 1;  // as both doors and their clients: no Nagle delay on a record's tail
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      std::unique_ptr<TlsChannel> channel;
      if (tls.first) {
        channel = std::make_unique<TlsChannel>(fd, tls.first->new_session(fd));
        if (Status st = channel->accept(deadline); !st.ok()) die(st);
      }
      auto stream = std::make_unique<WireStream>(fd, std::move(channel));
      std::vector<char> buf(2 << 20);
      for (size_t got = 0; got < bytes_per_conn;) {
        const size_t n = std::min(buf.size(), bytes_per_conn - got);
        if (Status st = stream->recv_exact(buf.data(), n, deadline); !st.ok()) die(st);
        got += n;
      }
      // The writer waits for this before it closes: a TLS 1.3 client that closes with the
      // server's session tickets unread sends a reset, which can destroy bytes still in flight.
      char done = 1;
      iovec ack{&done, 1};
      if (Status st = stream->send_all(std::span(&ack, 1), deadline); !st.ok()) die(st);
      stream.reset();  // its close_notify goes out before the socket closes
      ::close(fd);
    });
    threads.emplace_back([&] {  // writer
      const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      std::unique_ptr<TlsChannel> channel;
      if (tls.second) {
        channel = std::make_unique<TlsChannel>(fd, tls.second->new_client_session(fd, "127.0.0.1"));
        if (Status st = channel->connect(deadline); !st.ok()) die(st);
      }
      auto stream = std::make_unique<WireStream>(fd, std::move(channel));
      std::vector<char> buf(2 << 20, 1);
      for (size_t sent = 0; sent < bytes_per_conn;) {
        iovec piece{buf.data(), std::min(buf.size(), bytes_per_conn - sent)};
        sent += piece.iov_len;
        if (Status st = stream->send_all(std::span(&piece, 1), deadline); !st.ok()) die(st);
      }
      char done = 0;
      if (Status st = stream->recv_exact(&done, 1, deadline); !st.ok()) die(st);
      stream.reset();
      ::close(fd);
    });
  }
  for (auto& t : threads) t.join();
  const double s = seconds_since(t0);
  ::close(lfd);
  return static_cast<double>(bytes_per_conn) * conns / s / 1e9;
}

// One way into the server: a port, and how a client talks to it.
struct Door {
  const char* name;
  int port;
  bool binary;
  ClientTls tls;
};

// Runs `op(client, i)` for items [0, n) split over `conns` connections; returns seconds.
double run_parallel(const Door& door, int conns, size_t n, const std::function<void(KvtierClient&, size_t)>& op) {
  const bool binary = door.binary;
  std::vector<std::unique_ptr<KvtierClient>> clients;
  for (int c = 0; c < conns; ++c) {
    clients.push_back(std::make_unique<KvtierClient>("127.0.0.1", door.port, "", door.tls));
    clients.back()->use_binary(binary);
    if (Status st = clients.back()->healthz(); !st.ok()) die(st);  // connect outside the timing
    if (clients.back()->binary_in_use() != binary) die(internal_error("the binary port is not offered"));
    if (binary) (void)clients.back()->get(BlockHash{});  // opens its connection (a miss)
  }
  std::vector<std::thread> threads;
  const auto t0 = Clock::now();
  for (int c = 0; c < conns; ++c) {
    threads.emplace_back([&, c] {
      for (size_t i = static_cast<size_t>(c); i < n; i += static_cast<size_t>(conns)) op(*clients[c], i);
    });
  }
  for (auto& t : threads) t.join();
  return seconds_since(t0);
}

}  // namespace

int main(int argc, char** argv) {
  keep_freed_block_memory();
  CLI::App app{"server_bench: kvtierd's HTTP path on loopback"};
  int reps = 5, blocks = 64;
  double lookup_seconds = 1.0;
  app.add_option("--reps", reps)->capture_default_str();
  app.add_option("--blocks", blocks, "2 MiB blocks per PUT/GET repetition")->capture_default_str();
  app.add_option("--lookup-seconds", lookup_seconds, "Length of one lookup repetition")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  init_logging("warn");

  auto layout = std::make_shared<const KvLayout>(must(layout_preset("llama-3-8b")));
  CacheStackOptions so;
  so.layout = layout;
  so.ram.capacity_bytes = (static_cast<uint64_t>(blocks) + 256 + 16) * (layout->dense_block_bytes() + 4096);
  auto stack = must(CacheStack::open(so));
  BlockService service(*stack, HashAlgorithm::kSha256);
  HttpApi api(service, http_options(64, 5));
  const int port = must(api.bind("127.0.0.1", 0));
  WireServer wire(service, WireServerOptions{});
  api.offer_binary_port(must(wire.bind("127.0.0.1", 0)), false);
  testing::TempDir cert_dir;
  const testing::CertFiles cert = testing::write_self_signed_cert(cert_dir.str());
  HttpApi tls_api(service, http_options(64, 5, cert.cert, cert.key));
  if (!tls_api.status().ok()) die(tls_api.status());
  const int tls_port = must(tls_api.bind("127.0.0.1", 0));
  std::shared_ptr<const TlsContext> server_tls = must(TlsContext::load(cert.cert, cert.key));
  std::shared_ptr<const TlsContext> client_tls = must(TlsContext::client(cert.cert));
  WireServerOptions tls_wire_options;
  tls_wire_options.tls = server_tls;
  WireServer tls_wire(service, tls_wire_options);
  tls_api.offer_binary_port(must(tls_wire.bind("127.0.0.1", 0)), true);
  std::thread server([&] { api.run(); });
  std::thread tls_server([&] { tls_api.run(); });
  std::thread wire_server([&] { wire.run(); });
  std::thread tls_wire_server([&] { tls_wire.run(); });
  KvtierClient setup("127.0.0.1", port);
  while (!setup.healthz().ok()) std::this_thread::sleep_for(std::chrono::milliseconds(10));

  // 1. Lookups of a 4096-token prompt whose 256 blocks are all in RAM.
  const auto prompt = tokens_for(4096, 1);
  for (const Doc& d : prompt_documents(setup, layout, "bench", prompt)) must(setup.put(d.hash, d.bytes));
  Report lookups("server_bench: POST /v1/lookup, 4096-token prompt fully cached (256 blocks)",
                 {"connections", "requests/s", "p50 us", "p99 us", "matched tokens"});
  lookups.set_meta("machine", machine_description());
  for (int conns : {1, 8}) {
    std::vector<double> rates, p50s, p99s;
    for (int r = 0; r < reps; ++r) {
      std::vector<std::vector<double>> lat(conns);
      std::atomic<size_t> matched{0};
      std::vector<std::thread> threads;
      const auto end = Clock::now() + std::chrono::duration<double>(lookup_seconds);
      for (int c = 0; c < conns; ++c) {
        threads.emplace_back([&, c] {
          KvtierClient client("127.0.0.1", port);
          while (Clock::now() < end) {
            const auto t0 = Clock::now();
            auto reply = must(client.lookup("bench", prompt));
            lat[c].push_back(seconds_since(t0));
            matched = reply["matched_tokens"].get<size_t>();
          }
        });
      }
      for (auto& t : threads) t.join();
      std::vector<double> all;
      for (auto& l : lat) all.insert(all.end(), l.begin(), l.end());
      if (matched.load() != 4096) die(internal_error("lookup matched " + std::to_string(matched.load())));
      rates.push_back(all.size() / lookup_seconds);
      p50s.push_back(percentile(all, 0.5));
      p99s.push_back(percentile(all, 0.99));
    }
    lookups.add_row({std::to_string(conns), fmt_double(percentile(rates, 0.5), 0),
                     fmt_double(percentile(p50s, 0.5) * 1e6, 0), fmt_double(percentile(p99s, 0.5) * 1e6, 0), "4096"});
  }
  lookups.add_note("latency is client-side: JSON of 4096 tokens out, 256 hashes back, hashing and lookup in between");
  lookups.print();
  lookups.write_json(output_path("server_bench_lookup.json"));

  // 2. PUT and GET throughput of 2 MiB blocks.
  Report transfer("server_bench: PUT / GET of Llama-3-8B blocks (2 MiB documents) vs a loopback socket",
                  {"protocol", "connections", "PUT GB/s", "GET GB/s", "reference", "reference GB/s", "PUT / ref",
                   "GET / ref", "PUT / ref, pairs", "GET / ref, pairs"});
  transfer.set_meta("machine", machine_description());
  const Door doors[] = {{"http", port, false, {}},
                        {"https", tls_port, false, {true, cert.cert}},
                        {"binary", port, true, {}},
                        {"binary, TLS", tls_port, true, {true, cert.cert}}};
  for (const Door& door : doors)
  for (int conns : {1, 4}) {
    std::vector<double> puts, gets, sockets;
    for (int r = 0; r < reps; ++r) {
      // Fresh blocks for every row: a chain-aware RAM tier drops a block that arrives while its
      // parent is missing and was dropped lately (erased below), as out of order on 4 connections.
      const auto docs = prompt_documents(setup, layout, "bench",
                                         tokens_for(blocks * 16, 1000 + r * 100 + conns * 10 + static_cast<uint32_t>(&door - doors)));
      size_t bytes = 0;
      for (const Doc& d : docs) bytes += d.bytes.size();
      const double put_s = run_parallel(door, conns, docs.size(), [&](KvtierClient& c, size_t i) {
        if (!must(c.put(docs[i].hash, docs[i].bytes))) die(internal_error("a fresh block was already held"));
      });
      const double get_s = run_parallel(door, conns, docs.size(), [&](KvtierClient& c, size_t i) {
        Bytes got = must(c.get(docs[i].hash));
        if (got.size() != docs[i].bytes.size()) die(internal_error("GET returned another size"));
      });
      for (const Doc& d : docs) must(service.erase(d.hash));
      puts.push_back(bytes / put_s / 1e9);
      gets.push_back(bytes / get_s / 1e9);
      sockets.push_back(door.tls.enabled ? socket_copy_gbps(bytes / conns, conns, {server_tls.get(), client_tls.get()})
                                         : socket_copy_gbps(bytes / conns, conns));
    }
    const double put = percentile(puts, 0.5), get = percentile(gets, 0.5), sock = percentile(sockets, 0.5);
    transfer.add_row({door.name, std::to_string(conns), fmt_double(put), fmt_double(get),
                      door.tls.enabled ? "TLS socket" : "socket", fmt_double(sock),
                      fmt_double(put / sock), fmt_double(get / sock), paired_rate_ratio(sockets, puts).text(),
                      paired_rate_ratio(sockets, gets).text()});
  }
  transfer.add_note("PUT includes decoding and checking the document (hash, layout) and storing it in RAM; "
                    "GET includes encoding it from RAM. Reference: the same bytes per connection, one 2 MiB "
                    "write/read loop each and no protocol; for the TLS rows inside TLS (OpenSSL, the same "
                    "certificate and cipher), so they show the protocol's cost, not encryption's. "
                    "'pairs': each repetition runs PUT, GET and the reference in turn; the median and spread of "
                    "those repetitions' ratios, so a host that drifts between repetitions cancels out.");
  transfer.print();
  transfer.write_json(output_path("server_bench_transfer.json"));

  api.stop();
  tls_api.stop();
  wire.stop();
  tls_wire.stop();
  server.join();
  tls_server.join();
  wire_server.join();
  tls_wire_server.join();
  return 0;
}
