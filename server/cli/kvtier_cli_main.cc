// kvtier: the command-line client of kvtierd.
//   kvtier lookup --namespace NS --tokens 1,2,3      the cached prefix of a prompt
//   kvtier put BLOCK.safetensors                      store a block document (hash from its metadata)
//   kvtier get HASH -o BLOCK.safetensors              fetch one
//   kvtier delete HASH | stats | bench | fsck DIR
// Exit status: 0 done, 1 the server said no (the message says why), 2 bad usage or no server.
#include <chrono>
#include <fstream>
#include <iostream>
#include <iterator>

#include <CLI/CLI.hpp>

#include "base/build_info.h"
#include "base/byte_size.h"
#include "base/elapsed.h"
#include "cache/prefix_hasher.h"
#include "serialize/format/block_codec.h"
#include "server/cli/fsck_command.h"
#include "server/cli/kvtier_client.h"
#include "server/synthetic_block.h"

using namespace kvtier;
using nlohmann::json;

namespace {

int fail(const Status& st) {
  std::cerr << "kvtier: " << st.to_string() << "\n";
  return st.code() == StatusCode::kUnavailable ? 2 : 1;
}

Result<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("cannot read " + path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The hash a block document names in its metadata (the server checks it against the rest).
Result<BlockHash> document_hash(const std::string& doc) {
  if (doc.size() < 8) return invalid_argument("not a block document: shorter than 8 bytes");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(static_cast<uint8_t>(doc[i])) << (8 * i);
  if (n > doc.size() - 8) return invalid_argument("not a block document: header runs past the end");
  json h = json::parse(doc.substr(8, n), nullptr, false);
  if (h.is_discarded() || !h.contains("__metadata__") || !h["__metadata__"].contains("hash") ||
      !h["__metadata__"]["hash"].is_string()) {
    return invalid_argument("not a block document: no __metadata__.hash");
  }
  return BlockHash::from_hex(h["__metadata__"]["hash"].get<std::string>());
}

struct BenchResult {
  double put_gbps = 0, get_gbps = 0;
};

// PUTs then GETs `n` synthetic blocks of the server's layout; medians are the caller's business.
Result<BenchResult> bench(KvtierClient& client, int n, const std::string& ns) {
  KVTIER_ASSIGN_OR_RETURN(json info, client.layout());
  KVTIER_ASSIGN_OR_RETURN(KvLayout parsed, KvLayout::from_json(info["layout"]));
  auto layout = std::make_shared<const KvLayout>(std::move(parsed));
  const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
  std::vector<uint32_t> tokens(static_cast<size_t>(n) * layout->block_size);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>((now + i * 7919) & 0x7fffffff);
  KVTIER_ASSIGN_OR_RETURN(json found, client.lookup(ns, tokens));
  std::vector<Bytes> docs;
  std::vector<BlockHash> hashes;
  for (size_t i = 0; i < found["missing"].size(); ++i) {
    BlockIdentity id;
    KVTIER_ASSIGN_OR_RETURN(id.hash, BlockHash::from_hex(found["missing"][i]["hash"].get<std::string>()));
    KVTIER_ASSIGN_OR_RETURN(id.parent_hash,
                            BlockHash::from_hex(found["missing"][i]["parent_hash"].get<std::string>()));
    const size_t first = (found["blocks"].size() + i) * layout->block_size;
    id.token_ids.assign(tokens.begin() + first, tokens.begin() + first + layout->block_size);
    id.namespace_id = ns;
    Bytes doc;
    KVTIER_RETURN_IF_ERROR(BlockCodec::encode_document(synthetic_block(layout, id, i), doc));
    hashes.push_back(id.hash);
    docs.push_back(std::move(doc));
  }
  uint64_t bytes = 0;
  for (const Bytes& d : docs) bytes += d.size();
  auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < docs.size(); ++i) KVTIER_RETURN_IF_ERROR(client.put(hashes[i], docs[i]).status());
  const double put_s = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < docs.size(); ++i) {
    KVTIER_ASSIGN_OR_RETURN(Bytes got, client.get(hashes[i]));
    if (got.size() != docs[i].size() || !std::equal(got.begin(), got.end(), docs[i].begin())) {
      return corruption("block " + hashes[i].hex() + " came back different");
    }
  }
  const double get_s = seconds_since(t0);
  return BenchResult{bytes / put_s / 1e9, bytes / get_s / 1e9};
}

std::vector<uint32_t> parse_tokens(const std::string& text) {
  std::vector<uint32_t> out;
  std::string cur;
  for (char c : text + ",") {
    if (std::isdigit(static_cast<unsigned char>(c))) {
      cur += c;
    } else if (!cur.empty()) {
      out.push_back(static_cast<uint32_t>(std::stoul(cur)));
      cur.clear();
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kvtier: talk to a kvtierd"};
  app.set_version_flag("--version", version_text("kvtier"));
  app.require_subcommand(1);
  std::string host = "127.0.0.1", api_key, ns = "default", file, hash_hex, dir, tokens_text;
  int port = 8417, blocks = 64;
  bool repair = false;
  ClientTls tls;
  if (const char* env = std::getenv("KVTIER_API_KEY")) api_key = env;
  app.add_option("--host", host)->capture_default_str();
  app.add_option("--port", port)->capture_default_str();
  app.add_option("--api-key", api_key, "Bearer key (default: $KVTIER_API_KEY)");
  app.add_flag("--tls", tls.enabled, "HTTPS (a kvtierd started with --tls-cert)");
  app.add_option("--ca-cert", tls.ca_cert, "PEM file of the CA (or the self-signed certificate) to trust; implies --tls");
  bool http_only = false;
  app.add_flag("--http", http_only, "Blocks over HTTP even when the server offers its binary port");

  auto* lookup = app.add_subcommand("lookup", "The cached prefix of a prompt");
  lookup->add_option("--namespace", ns)->capture_default_str();
  lookup->add_option("--tokens", tokens_text, "Token ids, comma or space separated")->required();
  auto* put = app.add_subcommand("put", "Store a block document");
  put->add_option("file", file)->required();
  put->add_option("--namespace", ns, "Check the document is of this namespace");
  auto* get = app.add_subcommand("get", "Fetch a block document");
  get->add_option("hash", hash_hex)->required();
  get->add_option("-o,--output", file, "Where to write it (default: stdout)");
  get->add_option("--namespace", ns, "The block's namespace (a key with several must name one)");
  auto* del = app.add_subcommand("delete", "Remove a block from every tier");
  del->add_option("hash", hash_hex)->required();
  del->add_option("--namespace", ns, "The block's namespace (a key with several must name one)");
  auto* stats = app.add_subcommand("stats", "Tiers and metrics as JSON");
  auto* bench_cmd = app.add_subcommand("bench", "PUT then GET synthetic blocks; prints GB/s");
  bench_cmd->add_option("--blocks", blocks)->capture_default_str()->check(CLI::Range(1, 100000));
  bench_cmd->add_option("--namespace", ns)->capture_default_str();
  auto* fsck = app.add_subcommand("fsck", "Check the SSD directory of a stopped server");
  fsck->add_option("dir", dir)->required();
  fsck->add_flag("--repair", repair);
  CLI11_PARSE(app, argc, argv);

  if (fsck->parsed()) return run_fsck(dir, repair, false);
  tls.enabled = tls.enabled || !tls.ca_cert.empty();
  KvtierClient client(host, port, api_key, tls);
  client.use_binary(!http_only);
  const std::string block_ns = (get->count("--namespace") || del->count("--namespace")) ? ns : "";
  if (lookup->parsed()) {
    auto r = client.lookup(ns, parse_tokens(tokens_text));
    if (!r.ok()) return fail(r.status());
    std::cout << r->dump(2) << "\n";
  } else if (put->parsed()) {
    auto doc = read_file(file);
    if (!doc.ok()) return fail(doc.status());
    auto h = document_hash(*doc);
    if (!h.ok()) return fail(h.status());
    auto r = client.put(*h, {reinterpret_cast<const uint8_t*>(doc->data()), doc->size()},
                        put->count("--namespace") ? ns : "");
    if (!r.ok()) return fail(r.status());
    std::cout << (*r ? "stored " : "already present ") << h->hex() << "\n";
  } else if (get->parsed() || del->parsed()) {
    auto h = BlockHash::from_hex(hash_hex);
    if (!h.ok()) return fail(h.status());
    if (del->parsed()) {
      Status st = client.erase(*h, block_ns);
      if (!st.ok()) return fail(st);
      std::cout << "deleted " << h->hex() << "\n";
      return 0;
    }
    auto r = client.get(*h, block_ns);
    if (!r.ok()) return fail(r.status());
    if (file.empty()) {
      std::cout.write(reinterpret_cast<const char*>(r->data()), static_cast<std::streamsize>(r->size()));
    } else {
      std::ofstream(file, std::ios::binary).write(reinterpret_cast<const char*>(r->data()),
                                                  static_cast<std::streamsize>(r->size()));
      std::cerr << "wrote " << format_byte_size(r->size()) << " to " << file << "\n";
    }
  } else if (stats->parsed()) {
    auto r = client.stats();
    if (!r.ok()) return fail(r.status());
    std::cout << r->dump(2) << "\n";
  } else if (bench_cmd->parsed()) {
    auto r = bench(client, blocks, ns);
    if (!r.ok()) return fail(r.status());
    std::cout << "PUT " << r->put_gbps << " GB/s, GET " << r->get_gbps << " GB/s (" << blocks
              << " blocks, one connection, " << (client.binary_in_use() ? "binary protocol" : "HTTP") << ")\n";
  }
  return 0;
}
