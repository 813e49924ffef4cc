#include "server/block_service.h"

#include <cstdio>

#include "base/text/client_text.h"
#include "serialize/format/block_document.h"
#include "serialize/format/state_document.h"
#include "serialize/state_record.h"

namespace kvtier {
namespace {

std::string fingerprint_hex(uint64_t fp) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(fp));
  return buf;
}

}  // namespace

BlockService::BlockService(CacheStack& stack, HashAlgorithm hash, uint64_t max_body_memory)
    : stack_(stack),
      hash_(hash),
      namespace_fingerprint_(stack.layout().fingerprint()),
      layouts_(std::make_shared<LayoutRegistry>()),
      body_budget_(max_body_memory ? max_body_memory
                                   : std::max<uint64_t>(256ull << 20, 2 * default_max_body_bytes())) {
  (void)layouts_->add(stack.layout());  // validated when the stack was opened
}

BlockService::BlockService(CacheStack& stack, HashAlgorithm hash, uint64_t max_body_memory, const HybridLayout& hybrid)
    : BlockService(stack, hash, max_body_memory) {
  namespace_fingerprint_ = hybrid.fingerprint();
  // The cache's own hasher is used for snapshot keys only (they derive from block hashes alone).
  auto h = HybridPrefixCache::create(stack.cache(), hasher_for("kvtierd"), hybrid, stack.layouts());
  if (h.ok()) hybrid_ = std::move(h).value();
  else spdlog::error("hybrid layout {}: {}", hybrid.name(), h.status().to_string());  // checked by the options
}

BlockService::~BlockService() = default;

const HybridLayout* BlockService::hybrid_layout() const { return hybrid_ ? &hybrid_->layout() : nullptr; }

uint64_t BlockService::default_max_body_bytes() const {
  uint64_t largest = layout().dense_block_bytes();
  if (hybrid_) largest = std::max<uint64_t>(largest, hybrid_->layout().snapshot_bytes() + (1u << 20));
  return largest + (16ull << 20);
}

PrefixHasher BlockService::hasher_for(const std::string& ns) const {
  return PrefixHasher(hash_, Namespace{ns, namespace_fingerprint_, ""}, layout().block_size);
}

Status BlockService::check_prompt(const PromptRequest& r) const {
  KVTIER_RETURN_IF_ERROR(check_namespace(r.ns));
  for (const std::string& k : r.extra_keys) {
    if (k.size() > 256) return invalid_argument("an extra key is longer than 256 bytes");
  }
  return ok_status();
}

// Counted here; logged (once per interval, with this message) by the HTTP layer, which logs every
// refused request whatever refused it.
Status BlockService::reject(Counter& counter, Status status) {
  counter.inc();
  return status;
}

Result<LookupReply> BlockService::lookup(const PromptRequest& r) {
  KVTIER_RETURN_IF_ERROR(check_prompt(r));
  metrics_.lookups.inc();
  const PrefixHasher hasher = hasher_for(r.ns);
  const std::vector<BlockKey> keys = hasher.keys(r.tokens, r.extra_keys);
  LookupResult found;
  if (hybrid_) {
    HybridLookup h = hybrid_->lookup(keys);  // ends at the last block with a snapshot
    found.matched_tokens = h.matched_tokens;
    found.blocks = std::move(h.hits);
  } else {
    found = stack_.cache().lookup(keys, r.tokens.size());
  }
  LookupReply reply;
  static_cast<PrefixMatch&>(reply) = stack_.cache().describe(found, layout().dense_block_bytes());
  for (size_t i = found.blocks.size(); i < keys.size(); ++i) {
    reply.missing.push_back({keys[i].hash, i == 0 ? hasher.root() : keys[i - 1].hash});
  }
  return reply;
}

Result<InsertOutcome> BlockService::put(const BlockHash& hash, AlignedBuffer buffer, size_t length,
                                        std::string_view ns) {
  if (length > buffer.size()) return invalid_argument("document length past its buffer");
  if (!ns.empty()) KVTIER_RETURN_IF_ERROR(check_namespace(ns));
  auto decoded = decode_block_document_adopting(std::move(buffer), 0, length, *layouts_);
  if (!decoded.ok()) {
    // An unknown layout fingerprint is a well-formed document for another model.
    if (decoded.status().code() == StatusCode::kInvalidArgument) {
      return reject(metrics_.puts_rejected_inconsistent,
                    failed_precondition(decoded.status().message() + "; this server holds layout '" +
                                        layout().name + "' (fingerprint " +
                                        fingerprint_hex(layout().fingerprint()) + ")"));
    }
    return reject(metrics_.puts_rejected_malformed, invalid_argument(decoded.status().message()));
  }
  const BlockIdentity& id = decoded->identity();
  if (id.hash != hash) {
    return reject(metrics_.puts_rejected_inconsistent,
                  failed_precondition("the document's hash " + id.hash.hex() +
                                      " is not the hash in the path " + hash.hex()));
  }
  if (Status st = check_namespace(id.namespace_id); !st.ok()) {
    return reject(metrics_.puts_rejected_malformed, invalid_argument("the document's " + st.message()));
  }
  if (!ns.empty() && id.namespace_id != ns) {
    return reject(metrics_.puts_rejected_inconsistent,
                  failed_precondition("the document's namespace '" + escaped_text(id.namespace_id, 64) +
                                      "' is not the request's '" + escaped_text(ns, 64) + "'"));
  }
  if (!hasher_for(id.namespace_id).verifies(id)) {
    return reject(metrics_.puts_rejected_inconsistent,
                  failed_precondition("hash " + hash.hex() + " is not the " +
                                      std::string(hash_algorithm_name(hash_)) +
                                      " of the document's parent hash, namespace, tokens and extra keys"));
  }
  auto block = std::make_shared<const Block>(std::move(decoded).value());
  auto outcome = stack_.cache().insert(block);
  if (!outcome.ok()) {
    const StatusCode code = outcome.status().code();
    if (code == StatusCode::kConflict) return reject(metrics_.puts_rejected_collision, outcome.status());
    if (code == StatusCode::kNoSpace) return reject(metrics_.puts_rejected_quota, outcome.status());
    return reject(metrics_.puts_rejected_no_room,
                  resource_exhausted("no tier has room for the block: " + outcome.status().message()));
  }

  (*outcome == InsertOutcome::kInserted ? metrics_.puts_stored : metrics_.puts_duplicate).inc();
  return *outcome;
}

BlockRef BlockService::block_of(const PinnedBlocks::Entry& e, std::string_view ns) {
  BlockRef block = e.block;
  if (!block && stack_.gpu()) {  // served in place on the GPU: copy it down
    auto r = stack_.gpu()->read({e.hash, {}});
    if (r.ok()) block = *r;
  }
  if (!block || (!ns.empty() && block->identity().namespace_id != ns)) return nullptr;
  return block;
}

std::optional<BlockDocumentParts> BlockService::document_of(const PinnedBlocks::Entry& e, std::string_view ns) {
  BlockRef block = block_of(e, ns);
  if (!block) return std::nullopt;
  if (block->any_quantized()) block = std::make_shared<const Block>(block->dequantized());
  auto header = block_document_header(*block);
  if (!header.ok()) {
    metrics_.encode_failures.inc();
    encode_log_.error("GET {}: cannot encode the stored block: {}", e.hash.hex(),
                      header.status().to_string());
    return std::nullopt;
  }
  BlockDocumentParts parts{std::string(8, '\0'), std::move(block)};
  const uint64_t n = header->size();
  for (int i = 0; i < 8; ++i) parts.head[i] = static_cast<char>(n >> (8 * i));
  parts.head += *header;
  return parts;
}

Result<BlockDocumentParts> BlockService::get(const BlockHash& hash, std::string_view ns) {
  auto got = batch_get(std::span<const BlockHash>(&hash, 1), ns);
  if (!got.front()) return not_found("block " + hash.hex() + " is not cached");
  return std::move(*got.front());
}

std::vector<std::optional<BlockDocumentParts>> BlockService::batch_get(std::span<const BlockHash> hashes,
                                                                       std::string_view ns) {
  std::vector<std::optional<BlockDocumentParts>> out(hashes.size());
  std::vector<BlockKey> keys;
  for (const BlockHash& h : hashes) keys.push_back({h, {}});  // no tokens: GET by hash
  // fetch() returns the present prefix of what it is given; restart after each miss.
  size_t next = 0;
  while (next < keys.size()) {
    PinnedBlocks pinned = stack_.cache().fetch(std::span(keys).subspan(next));
    for (size_t i = 0; i < pinned.size(); ++i) out[next + i] = document_of(pinned.entries()[i], ns);
    next += pinned.size() + 1;  // skips the miss that ended the run
  }
  for (const auto& d : out) (d ? metrics_.gets_hit : metrics_.gets_miss).inc();
  return out;
}

Result<bool> BlockService::erase(const BlockHash& hash, std::string_view ns) {
  // Another namespace's block looks exactly like an absent one: untouched, "not cached"
  // (TieredCache::erase_in).
  Result<bool> held = false;
  if (ns.empty()) {
    held = stack_.cache().erase(hash);
  } else {
    auto scoped = stack_.cache().erase_in(ns, hash);
    if (scoped.ok() && *scoped == TieredCache::ScopedErase::kForeign) return false;
    if (scoped.ok()) held = *scoped == TieredCache::ScopedErase::kErased;
    else held = scoped.status();
  }
  // Its snapshot cannot be used without it, and a delete is the client's word that it must go.
  Result<bool> snapshot = hybrid_ ? hybrid_->erase_snapshot(hash) : Result<bool>(false);
  if (!held.ok() || !snapshot.ok()) {
    metrics_.delete_failures.inc();
    return held.ok() ? snapshot.status() : held.status();
  }
  if (*held) metrics_.deletes.inc();
  return held;
}

Result<InsertOutcome> BlockService::put_state(const BlockHash& hash, std::span<const uint8_t> document,
                                              std::string_view ns) {
  if (!hybrid_) {
    return reject(metrics_.puts_rejected_inconsistent,
                  failed_precondition("this server holds a plain layout: state snapshots need --hybrid-layout"));
  }
  if (!ns.empty()) KVTIER_RETURN_IF_ERROR(check_namespace(ns));
  const HybridLayout& h = hybrid_->layout();
  auto snapshot = decode_state_document(document, h);
  if (!snapshot.ok()) {
    const bool other_layout = snapshot.status().message().find("fingerprint") != std::string::npos;
    return reject(other_layout ? metrics_.puts_rejected_inconsistent : metrics_.puts_rejected_malformed,
                  other_layout ? failed_precondition(snapshot.status().message() + "; this server holds hybrid layout '" +
                                                     h.name() + "' (fingerprint " + h.fingerprint_hex() + ")")
                               : invalid_argument(snapshot.status().message()));
  }
  if (snapshot->at != hash) {
    return reject(metrics_.puts_rejected_inconsistent,
                  failed_precondition("the document's hash " + snapshot->at.hex() + " is not the hash in the path " +
                                      hash.hex()));
  }
  // The block the snapshot ends at: its identity is the snapshot's (namespace, tokens, extra keys).
  auto block = stack_.cache().read_record(BlockRequest{hash, {}});
  if (!block.ok() || (!ns.empty() && (*block)->identity().namespace_id != ns)) {
    return reject(metrics_.puts_rejected_inconsistent,
                  failed_precondition("block " + hash.hex() + " is not cached: PUT the block before its state"));
  }
  if (snapshot->ns != (*block)->identity().namespace_id) {
    return reject(metrics_.puts_rejected_inconsistent,
                  failed_precondition("the document's namespace is not its block's"));
  }
  if (Status st = check_prefix_length(**block, snapshot->tokens); !st.ok()) {
    return reject(metrics_.puts_rejected_inconsistent, st);
  }
  auto r = hybrid_->store_snapshot((*block)->identity(), snapshot->tokens, snapshot->data.span());
  if (!r.ok()) return reject(metrics_.puts_rejected_no_room, r.status());
  return r;
}

Status BlockService::check_prefix_length(const Block& block, uint64_t tokens) {
  const uint64_t bs = static_cast<uint64_t>(stack_.layout().block_size);
  const auto wrong = [&](const std::string& why) {
    return failed_precondition("the document says its snapshot follows " + std::to_string(tokens) + " tokens, but " +
                               why);
  };
  if (tokens == 0 || tokens % bs != 0) return wrong("a snapshot is taken after a whole number of blocks of " +
                                                    std::to_string(bs) + " tokens");
  // The block's chain, walked back to the namespace's root where each block lies (read, not
  // fetched: nothing moves up). Its length is the prefix the block ends.
  const BlockHash root = hasher_for(block.identity().namespace_id).root();
  BlockHash parent = block.identity().parent_hash;
  uint64_t blocks = 1;
  for (; parent != root; ++blocks) {
    if (blocks >= tokens / bs) return wrong("block " + block.hash().hex() + " ends a longer prefix");
    BlockRef held;
    for (const auto& tier : stack_.cache().tiers()) {
      if (tier->remote() || !tier->contains(parent)) continue;
      if (auto r = tier->read({parent, {}}); r.ok()) held = *r;
      break;
    }
    if (!held) {
      return failed_precondition("block " + parent.hex() + ", before " + block.hash().hex() +
                                 " in its prompt, is not cached: PUT a prompt's blocks from its first before its state");
    }
    parent = held->identity().parent_hash;
  }
  if (blocks != tokens / bs) {
    return wrong("block " + block.hash().hex() + " ends a prefix of " + std::to_string(blocks * bs));
  }
  return ok_status();
}

Result<Bytes> BlockService::get_state(const BlockHash& hash, std::string_view ns) {
  if (!hybrid_) return failed_precondition("this server holds a plain layout: state snapshots need --hybrid-layout");
  if (!ns.empty()) KVTIER_RETURN_IF_ERROR(check_namespace(ns));
  auto record = hybrid_->read_record(hash);
  if (!record.ok() || (!ns.empty() && (*record)->identity().namespace_id != ns)) {
    metrics_.gets_miss.inc();
    return not_found("no state snapshot at block " + hash.hex());
  }
  const HybridLayout& h = hybrid_->layout();
  StateSnapshot s;
  s.at = hash;
  s.ns = (*record)->identity().namespace_id;
  KVTIER_ASSIGN_OR_RETURN(s.tokens, prefix_tokens_of(**record));
  KVTIER_ASSIGN_OR_RETURN(s.data, snapshot_of(h, **record));
  Bytes out;
  if (Status st = encode_state_document(h, s, out); !st.ok()) {
    metrics_.encode_failures.inc();
    return st;
  }
  metrics_.gets_hit.inc();
  return out;
}

Result<PrefetchReply> BlockService::prefetch(const PromptRequest& r) {
  KVTIER_RETURN_IF_ERROR(check_prompt(r));
  const std::vector<BlockKey> keys = hasher_for(r.ns).keys(r.tokens, r.extra_keys);
  const LookupResult found = stack_.cache().lookup(keys, r.tokens.size());
  PrefetchReply reply;
  reply.matched_tokens = found.matched_tokens;
  const auto& tiers = stack_.cache().tiers();
  std::vector<BlockRequest> reads;
  for (size_t i = 0; i < found.blocks.size(); ++i) {
    reply.tiers.push_back(tiers[found.blocks[i].tier]->name());
    if (tiers[found.blocks[i].tier].get() == stack_.ssd()) reads.push_back({keys[i].hash, keys[i].tokens});
    else ++reply.already_warm;
  }
  if (reads.empty() || !stack_.ssd()) return reply;
  // A move: a block deleted while it is read is refused by RAM instead of coming back.
  const EraseFence::Move move = stack_.cache().begin_move();
  std::vector<Result<BlockRef>> got = stack_.ssd()->read_many(reads);
  for (auto& g : got) {
    if (g.ok() && stack_.ram().insert(*g).ok()) ++reply.prefetched;
    else ++reply.failed;
  }
  metrics_.prefetched_blocks.inc(reply.prefetched);
  if (reply.failed > 0) {
    metrics_.prefetch_failures.inc(reply.failed);
    prefetch_log_.warn(
        "prefetch in '{}': {} of {} SSD blocks not warmed (failed their checks, or RAM had no "
        "room: see the ssd and ram tier metrics)",
        escaped_text(r.ns, 64), reply.failed, reads.size());
  }
  return reply;
}

void BlockService::visit_metrics(MetricVisitor& v) const {
  if (hybrid_) hybrid_->visit_metrics(v);
  body_budget_.visit_metrics(v);
  v.counter("kvtier_server_lookups_total", "Prompt lookups", {}, metrics_.lookups.value());
  const char* put_help = "Block PUTs by outcome";
  v.counter("kvtier_server_puts_total", put_help, {{"outcome", "stored"}}, metrics_.puts_stored.value());
  v.counter("kvtier_server_puts_total", put_help, {{"outcome", "duplicate"}}, metrics_.puts_duplicate.value());
  v.counter("kvtier_server_puts_total", put_help, {{"outcome", "rejected_malformed"}},
            metrics_.puts_rejected_malformed.value());
  v.counter("kvtier_server_puts_total", put_help, {{"outcome", "rejected_inconsistent"}},
            metrics_.puts_rejected_inconsistent.value());
  v.counter("kvtier_server_puts_total", put_help, {{"outcome", "rejected_collision"}},
            metrics_.puts_rejected_collision.value());
  v.counter("kvtier_server_puts_total", put_help, {{"outcome", "rejected_no_room"}},
            metrics_.puts_rejected_no_room.value());
  v.counter("kvtier_server_puts_total", put_help, {{"outcome", "rejected_quota"}},
            metrics_.puts_rejected_quota.value());
  v.counter("kvtier_server_gets_total", "Blocks asked for by hash", {{"outcome", "hit"}}, metrics_.gets_hit.value());
  v.counter("kvtier_server_gets_total", "Blocks asked for by hash", {{"outcome", "miss"}}, metrics_.gets_miss.value());
  v.counter("kvtier_server_encode_failures_total", "Stored blocks that could not be encoded for a GET (served as misses)",
            {}, metrics_.encode_failures.value());
  v.counter("kvtier_server_prefetch_failures_total", "SSD blocks a prefetch could not warm into RAM", {},
            metrics_.prefetch_failures.value());
  v.counter("kvtier_server_deletes_total", "Blocks deleted", {}, metrics_.deletes.value());
  v.counter("kvtier_server_delete_failures_total",
            "Deletes a tier could not make last (answered 5xx: the block may still be held)", {},
            metrics_.delete_failures.value());
  v.counter("kvtier_server_prefetched_blocks_total", "Blocks read from SSD into RAM by prefetch", {},
            metrics_.prefetched_blocks.value());
}

}  // namespace kvtier
