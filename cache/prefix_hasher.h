// Prefix hashing: a prompt's tokens split into full blocks, each named by a hash chained from the
// one before it, so equal hashes mean equal prefixes. One small pure function, as in vLLM:
//   hash(block i) = H(hash(block i-1) || namespace || token_ids || extra_keys)
// where block 0's parent is a root derived from the namespace. The namespace folds in the model,
// the layout fingerprint and an optional tenant salt, so two models or two tenants never share a
// block. H is SHA-256 (collision resistant: a tenant cannot forge a hit) or, on request, xxh3-128.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "serialize/block.h"
#include "serialize/block_hash.h"

namespace kvtier {

enum class HashAlgorithm { kSha256, kXxh3 };
std::string_view hash_algorithm_name(HashAlgorithm a);  // "sha256", "xxh3"
Result<HashAlgorithm> parse_hash_algorithm(std::string_view name);

// A namespace is 1 to kMaxNamespaceBytes bytes of UTF-8 on every door (kvtierd's two, Python,
// C): anything else is kInvalidArgument, whichever door it came through.
inline constexpr size_t kMaxNamespaceBytes = 1024;
Status check_namespace(std::string_view ns);

struct Namespace {
  std::string model_id;       // stored with each block (metadata "namespace")
  uint64_t layout_fingerprint = 0;
  std::string tenant_salt;    // secret; never stored
};

// What a request needs to address one block and check it on a hit.
struct BlockKey {
  BlockHash hash;
  std::span<const uint32_t> tokens;  // the block's token ids as the request has them
};

// Immutable after construction; thread-safe.
class PrefixHasher {
 public:
  PrefixHasher(HashAlgorithm algorithm, Namespace ns, int block_size);

  HashAlgorithm algorithm() const { return algorithm_; }
  const Namespace& ns() const { return ns_; }
  int block_size() const { return block_size_; }
  // The parent of every prompt's first block.
  const BlockHash& root() const { return root_; }

  BlockHash hash_block(const BlockHash& parent, std::span<const uint32_t> tokens,
                       std::span<const std::string> extra_keys) const;
  // Hashes of every full block of `tokens` (a partial last block is never hashed).
  std::vector<BlockHash> hash_prefix(std::span<const uint32_t> tokens,
                                     std::span<const std::string> extra_keys) const;
  // hash_prefix plus each block's token span. The spans point into `tokens`: keep the tokens
  // alive (not a temporary) for as long as the keys are used.
  std::vector<BlockKey> keys(std::span<const uint32_t> tokens,
                             std::span<const std::string> extra_keys) const;
  // The identity a block computed for `keys[i]` is stored with.
  BlockIdentity identity(const std::vector<BlockKey>& keys, size_t i,
                         std::span<const std::string> extra_keys) const;
  // The key of the state snapshot (hybrid models) taken at the end of block `block`: a hash of
  // its own, derived from the block's alone (which already names the namespace and the whole
  // prefix), so a record never shares a key with a block and whoever holds a block can find its
  // snapshot, whatever namespace hashed it.
  BlockHash snapshot_key(const BlockHash& block) const;
  // True when `id.hash` is what this hasher computes from id's parent, tokens and extra keys.
  bool verifies(const BlockIdentity& id) const;

 private:
  BlockHash digest(std::span<const uint8_t> bytes) const;

  HashAlgorithm algorithm_;
  Namespace ns_;
  int block_size_;
  BlockHash ns_digest_;  // H of the namespace's fields, mixed into every block
  BlockHash root_;
};

}  // namespace kvtier
