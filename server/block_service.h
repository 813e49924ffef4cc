// BlockService: what kvtierd does, without HTTP. It turns requests (a prompt to look up, a block
// document to store, hashes to fetch) into TieredCache calls and checks everything a client sends
// before it touches the cache: a stored block's hash must be what its parent, tokens, namespace
// and extra keys hash to, and its layout must be the server's. Errors come back as Status codes
// the HTTP layer maps to statuses: kInvalidArgument (malformed) 400, kFailedPrecondition
// (well-formed but inconsistent) 422, kConflict 409, kNotFound 404, kResourceExhausted 503,
// kPermissionDenied 403, kNoSpace (a namespace at its quota) 507.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/log.h"
#include "base/memory/aligned_buffer.h"
#include "base/memory/bytes.h"
#include "base/metrics/metrics.h"
#include "cache/cache_stack.h"
#include "cache/hybrid_prefix_cache.h"
#include "cache/prefix_hasher.h"
#include "server/net/body_budget.h"

namespace kvtier {


struct PromptRequest {
  std::string ns;  // the model id half of the namespace (the layout is the server's)
  std::vector<uint32_t> tokens;
  std::vector<std::string> extra_keys;
};

// The cached prefix as every door answers it, and for a client that computes the rest, the full
// blocks after it with what it needs to PUT each once computed.
struct LookupReply : PrefixMatch {
  struct Missing {
    BlockHash hash;
    BlockHash parent_hash;
  };
  std::vector<Missing> missing;
};

struct PrefetchReply {
  size_t matched_tokens = 0;
  size_t already_warm = 0;  // blocks of the prefix already in GPU or RAM
  size_t prefetched = 0;    // blocks read from the SSD into RAM
  size_t failed = 0;        // SSD reads that failed their checks (quarantined there)
  std::vector<std::string_view> tiers;  // the tier each block of the prefix was found in
};

// A block document as the pieces it is made of, so a GET streams the KV bytes the tier holds
// instead of copying them into a fresh document: `head` is the 8-byte header length and the JSON
// header, then come `block`'s bytes (a dense block: a quantized one is dequantized first).
struct BlockDocumentParts {
  std::string head;
  BlockRef block;
  uint64_t size() const { return head.size() + block->data().size(); }
};

struct BlockServiceMetrics {
  Counter lookups;
  Counter puts_stored;
  Counter puts_duplicate;
  Counter puts_rejected_malformed;
  Counter puts_rejected_inconsistent;  // wrong layout, hash or namespace
  Counter puts_rejected_collision;
  Counter puts_rejected_no_room;
  Counter puts_rejected_quota;  // the namespace is at its RAM quota (507)
  Counter gets_hit;
  Counter gets_miss;
  Counter deletes;
  Counter delete_failures;  // a tier could not make the erase last
  Counter prefetched_blocks;
  Counter prefetch_failures;
  Counter encode_failures;
};

// Thread-safe.
class BlockService {
 public:
  // `max_body_memory`: the bytes of request bodies both doors may hold at once before they are
  // stored (0: 256 MiB, and at least two of the largest body a door accepts).
  BlockService(CacheStack& stack, HashAlgorithm hash, uint64_t max_body_memory = 0);
  // A hybrid model's server (kvtierd --hybrid-layout; `stack` holds its attention layers'
  // layout): blocks are hashed under the hybrid's fingerprint, lookups end at the last block with
  // a state snapshot, and snapshots are stored and served (put_state, get_state).
  BlockService(CacheStack& stack, HashAlgorithm hash, uint64_t max_body_memory, const HybridLayout& hybrid);
  ~BlockService();
  const HybridLayout* hybrid_layout() const;

  const KvLayout& layout() const { return stack_.layout(); }
  HashAlgorithm hash_algorithm() const { return hash_; }
  CacheStack& stack() { return stack_; }
  BodyBudget& body_budget() { return body_budget_; }
  // The largest body a door accepts by default: a block document of the layout (or a state
  // document, when larger) plus 16 MiB.
  uint64_t default_max_body_bytes() const;

  Result<LookupReply> lookup(const PromptRequest& request);
  // `document` is one block document (serialize/format/block_document.h) stored under `hash`; a
  // non-empty `ns` must be the document's namespace. kInserted (201) or kAlreadyPresent (200).
  // The document starts `buffer` and is `length` bytes long; the stored block keeps the buffer as
  // its storage (no copy of the KV).
  Result<InsertOutcome> put(const BlockHash& hash, AlignedBuffer buffer, size_t length, std::string_view ns);
  // The block's document, promoted to the top tier. With `ns` non-empty, a block of another
  // namespace is a miss: a tenant only ever sees its own blocks.
  Result<BlockDocumentParts> get(const BlockHash& hash, std::string_view ns);
  // Each hash's document or nullopt for a miss, in request order; runs of present blocks are
  // fetched together (the SSD tier reads them in one batch).
  std::vector<std::optional<BlockDocumentParts>> batch_get(std::span<const BlockHash> hashes, std::string_view ns);
  // With `ns` non-empty, only a block of that namespace is erased (another's is "not cached").
  // False when nothing held it; an error when a tier could not make the erase last (the SSD's
  // index on a full disk): the client must not take the block for gone.
  Result<bool> erase(const BlockHash& hash, std::string_view ns = {});
  // Hybrid servers. `document` is a state document (serialize/format/state_document.h) of the
  // snapshot taken at the end of block `hash`, which must be cached: the block's identity names
  // the snapshot's namespace and tokens (a snapshot is never stored without its block).
  // kInserted (201) or kAlreadyPresent (200); kInvalidArgument (400) malformed;
  // kFailedPrecondition (422) another layout, another hash, the block not cached, not hybrid.
  Result<InsertOutcome> put_state(const BlockHash& hash, std::span<const uint8_t> document, std::string_view ns);
  // The state document of the snapshot at the end of block `hash`; kNotFound (404) on a miss or
  // another namespace's snapshot.
  Result<Bytes> get_state(const BlockHash& hash, std::string_view ns);
  // Reads the prompt's cached prefix from the SSD into RAM, ahead of a fetch.
  Result<PrefetchReply> prefetch(const PromptRequest& request);

  const BlockServiceMetrics& metrics() const { return metrics_; }
  void visit_metrics(MetricVisitor& visitor) const;

 private:
  PrefixHasher hasher_for(const std::string& ns) const;
  // Whether `block` ends a prefix of `tokens` tokens: its chain is walked back to the root through
  // the local tiers. kFailedPrecondition saying why not.
  Status check_prefix_length(const Block& block, uint64_t tokens);
  Status check_prompt(const PromptRequest& request) const;
  Status reject(Counter& counter, Status status);
  // The entry's block (downloaded from the device tier), or nullptr when it is not of `ns`.
  BlockRef block_of(const PinnedBlocks::Entry& entry, std::string_view ns);
  // The documents of the pinned entries (downloading device-tier blocks), namespace-checked.
  std::optional<BlockDocumentParts> document_of(const PinnedBlocks::Entry& entry, std::string_view ns);

  CacheStack& stack_;
  const HashAlgorithm hash_;
  uint64_t namespace_fingerprint_;  // the layout's, or the hybrid layout's
  std::unique_ptr<HybridPrefixCache> hybrid_;
  std::shared_ptr<LayoutRegistry> layouts_;
  BlockServiceMetrics metrics_;
  BodyBudget body_budget_;
  LogThrottle encode_log_;
  LogThrottle prefetch_log_;
};

}  // namespace kvtier
