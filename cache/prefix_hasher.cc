#include "cache/prefix_hasher.h"

#include <bit>
#include <cstring>

#include <openssl/evp.h>
#include <xxhash.h>

#include "base/text/client_text.h"

namespace kvtier {

Status check_namespace(std::string_view ns) {
  if (ns.empty()) return invalid_argument("namespace is empty");
  if (ns.size() > kMaxNamespaceBytes) {
    return invalid_argument("a namespace is at most " + std::to_string(kMaxNamespaceBytes) + " bytes; this one has " +
                            std::to_string(ns.size()));
  }
  if (!is_valid_utf8(ns)) return invalid_argument("namespace '" + escaped_text(ns, 64) + "' is not valid UTF-8");
  return ok_status();
}

namespace {

void append_u32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void append_u64(std::vector<uint8_t>& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
// Length-prefixed, so ("ab","c") and ("a","bc") hash differently.
void append_str(std::vector<uint8_t>& out, std::string_view s) {
  append_u32(out, static_cast<uint32_t>(s.size()));
  out.insert(out.end(), s.begin(), s.end());
}

// OpenSSL 3's one-shot SHA256() looks the algorithm up on every call, which costs more than hashing
// a 136-byte block; a digest fetched once and a context per thread cost a quarter of it.
class Sha256Context {
 public:
  Sha256Context() : md_(EVP_MD_fetch(nullptr, "SHA256", nullptr)), ctx_(EVP_MD_CTX_new()) {}
  ~Sha256Context() {
    EVP_MD_CTX_free(ctx_);
    EVP_MD_free(md_);
  }
  Sha256Context(const Sha256Context&) = delete;
  Sha256Context& operator=(const Sha256Context&) = delete;
  void digest(std::span<const uint8_t> bytes, uint8_t* out) {
    unsigned int len = 0;
    EVP_DigestInit_ex2(ctx_, md_, nullptr);
    EVP_DigestUpdate(ctx_, bytes.data(), bytes.size());
    EVP_DigestFinal_ex(ctx_, out, &len);
  }

 private:
  EVP_MD* md_;
  EVP_MD_CTX* ctx_;
};

}  // namespace

std::string_view hash_algorithm_name(HashAlgorithm a) {
  return a == HashAlgorithm::kSha256 ? "sha256" : "xxh3";
}

Result<HashAlgorithm> parse_hash_algorithm(std::string_view name) {
  if (name == "sha256") return HashAlgorithm::kSha256;
  if (name == "xxh3") return HashAlgorithm::kXxh3;
  return invalid_argument("unknown hash '" + std::string(name) + "' (expected sha256 or xxh3)");
}

PrefixHasher::PrefixHasher(HashAlgorithm algorithm, Namespace ns, int block_size)
    : algorithm_(algorithm), ns_(std::move(ns)), block_size_(block_size) {
  std::vector<uint8_t> buf;
  const std::string_view tag = "kvtier.namespace.v1";
  buf.insert(buf.end(), tag.begin(), tag.end());
  append_str(buf, hash_algorithm_name(algorithm_));
  append_str(buf, ns_.model_id);
  append_u64(buf, ns_.layout_fingerprint);
  append_str(buf, ns_.tenant_salt);
  append_u32(buf, static_cast<uint32_t>(block_size_));
  ns_digest_ = digest(buf);
  buf.clear();
  const std::string_view root_tag = "kvtier.root.v1";
  buf.insert(buf.end(), root_tag.begin(), root_tag.end());
  buf.insert(buf.end(), ns_digest_.bytes.begin(), ns_digest_.bytes.end());
  root_ = digest(buf);
}

BlockHash PrefixHasher::digest(std::span<const uint8_t> bytes) const {
  BlockHash h;
  if (algorithm_ == HashAlgorithm::kSha256) {
    thread_local Sha256Context sha;
    sha.digest(bytes, h.bytes.data());
  } else {
    // xxh3-128 fills the first 16 bytes (canonical big-endian form); the rest stay zero.
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(bytes.data(), bytes.size()));
    std::memcpy(h.bytes.data(), c.digest, sizeof(c.digest));
  }
  return h;
}

BlockHash PrefixHasher::hash_block(const BlockHash& parent, std::span<const uint32_t> tokens,
                                   std::span<const std::string> extra_keys) const {
  // parent(32) || namespace(32) || n_tokens u32 || tokens u32 LE || n_extra u32 || extra keys
  thread_local std::vector<uint8_t> buf;
  buf.clear();
  buf.insert(buf.end(), parent.bytes.begin(), parent.bytes.end());
  buf.insert(buf.end(), ns_digest_.bytes.begin(), ns_digest_.bytes.end());
  append_u32(buf, static_cast<uint32_t>(tokens.size()));
  // The tokens as little-endian u32s: on a little-endian host that is their memory, copied at
  // once. Byte by byte, building the buffer cost a sixth of a 2047-block prefix's hashing (H100
  // host: 0.59 -> 0.49 ms, cache_bench, docs/benchmarks.md).
  if constexpr (std::endian::native == std::endian::little) {
    const size_t at = buf.size();
    buf.resize(at + tokens.size_bytes());
    std::memcpy(buf.data() + at, tokens.data(), tokens.size_bytes());
  } else {
    for (uint32_t t : tokens) append_u32(buf, t);
  }
  append_u32(buf, static_cast<uint32_t>(extra_keys.size()));
  for (const std::string& k : extra_keys) append_str(buf, k);
  return digest(buf);
}

std::vector<BlockHash> PrefixHasher::hash_prefix(std::span<const uint32_t> tokens,
                                                 std::span<const std::string> extra_keys) const {
  std::vector<BlockHash> out;
  const size_t full = tokens.size() / block_size_;
  out.reserve(full);
  BlockHash parent = root_;
  for (size_t i = 0; i < full; ++i) {
    parent = hash_block(parent, tokens.subspan(i * block_size_, block_size_), extra_keys);
    out.push_back(parent);
  }
  return out;
}

std::vector<BlockKey> PrefixHasher::keys(std::span<const uint32_t> tokens,
                                         std::span<const std::string> extra_keys) const {
  std::vector<BlockHash> hashes = hash_prefix(tokens, extra_keys);
  std::vector<BlockKey> out(hashes.size());
  for (size_t i = 0; i < hashes.size(); ++i) {
    out[i] = {hashes[i], tokens.subspan(i * block_size_, block_size_)};
  }
  return out;
}

BlockIdentity PrefixHasher::identity(const std::vector<BlockKey>& keys, size_t i,
                                     std::span<const std::string> extra_keys) const {
  BlockIdentity id;
  id.hash = keys[i].hash;
  id.parent_hash = i == 0 ? root_ : keys[i - 1].hash;
  id.token_ids.assign(keys[i].tokens.begin(), keys[i].tokens.end());
  id.namespace_id = ns_.model_id;
  id.extra_keys.assign(extra_keys.begin(), extra_keys.end());
  return id;
}

BlockHash PrefixHasher::snapshot_key(const BlockHash& block) const {
  std::vector<uint8_t> buf;
  const std::string_view tag = "kvtier.state.v1";
  buf.insert(buf.end(), tag.begin(), tag.end());
  buf.insert(buf.end(), block.bytes.begin(), block.bytes.end());
  return digest(buf);
}

bool PrefixHasher::verifies(const BlockIdentity& id) const {
  return id.namespace_id == ns_.model_id &&
         static_cast<int>(id.token_ids.size()) == block_size_ &&
         hash_block(id.parent_hash, id.token_ids, id.extra_keys) == id.hash;
}

}  // namespace kvtier
