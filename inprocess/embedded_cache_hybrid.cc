// EmbeddedCache for hybrid models: state snapshots beside the blocks, and loads that end at the
// last block with one (cache/hybrid_prefix_cache.h).
#include "inprocess/embedded_cache.h"
#include "inprocess/embedded_cache_impl.h"
#include "inprocess/state_tensors.h"

#include <fstream>
#include <sstream>

namespace kvtier {

Result<HybridLayout> hybrid_layout_from(const std::string& text_or_path) {
  if (!text_or_path.empty() && text_or_path.front() == '{') return HybridLayout::from_json_text(text_or_path);
  std::ifstream in(text_or_path);
  if (!in) return io_error("cannot read " + text_or_path);
  std::stringstream text;
  text << in.rdbuf();
  return HybridLayout::from_json_text(text.str());
}

const HybridLayout* EmbeddedCache::hybrid_layout() const { return impl_->hybrid ? &impl_->hybrid->layout() : nullptr; }

std::vector<BlockKey> EmbeddedCache::Impl::loadable_keys(std::span<const uint32_t> tokens,
                                                         std::span<const std::string> extra_keys) {
  std::vector<BlockKey> keys = prompt_keys(tokens, extra_keys);
  if (hybrid) keys.resize(hybrid->lookup(keys).blocks);
  return keys;
}

Status EmbeddedCache::Impl::check_state_call(std::span<const uint32_t> tokens) const {
  if (!hybrid) return failed_precondition("state snapshots need a hybrid cache (hybrid_layout)");
  const size_t bs = static_cast<size_t>(hasher->block_size());
  if (tokens.empty() || tokens.size() % bs != 0) {
    return invalid_argument("a state snapshot is taken after a whole number of blocks: " +
                            std::to_string(tokens.size()) + " tokens, blocks of " + std::to_string(bs));
  }
  return ok_status();
}

Result<bool> EmbeddedCache::store_state(const Prompt& prompt, std::span<const uint8_t> snapshot) {
  KVTIER_ASSIGN_OR_RETURN(auto call, enter(prompt));
  if (Status st = impl_->check_state_call(prompt.tokens); !st.ok()) return impl_->reject(st);
  const std::vector<BlockKey> keys = impl_->prompt_keys(prompt.tokens, prompt.extra_keys);
  // As kvtierd answers it (422): a snapshot is of no use without the block it ends at.
  if (impl_->stack->cache().presence({keys.back().hash, keys.back().tokens}) == Tier::Presence::kAbsent) {
    return impl_->reject(failed_precondition("the block ending at token " + std::to_string(prompt.tokens.size()) +
                                             " is not cached: store a prompt's blocks before its state"));
  }
  auto r = impl_->hybrid->store_snapshot(keys, keys.size() - 1, prompt.extra_keys, snapshot);
  if (!r.ok()) {
    if (r.status().code() == StatusCode::kInvalidArgument) return impl_->reject(r.status());
    return r.status();  // no tier took it: counted and logged by the hybrid cache
  }
  return *r == InsertOutcome::kInserted;
}

Result<bool> EmbeddedCache::store_state(const Prompt& prompt, std::span<const LayerKv> state) {
  if (!impl_->hybrid) return store_state(prompt, std::span<const uint8_t>());  // refused there
  auto bytes = gather_state(impl_->hybrid->layout(), state);
  if (!bytes.ok()) {
    KVTIER_ASSIGN_OR_RETURN(auto call, enter());
    return impl_->reject(bytes.status());
  }
  return store_state(prompt, std::span<const uint8_t>(*bytes));
}

Result<std::optional<std::vector<uint8_t>>> EmbeddedCache::fetch_state(const Prompt& prompt) {
  KVTIER_ASSIGN_OR_RETURN(auto call, enter(prompt));
  if (Status st = impl_->check_state_call(prompt.tokens); !st.ok()) return impl_->reject(st);
  const std::vector<BlockKey> keys = impl_->prompt_keys(prompt.tokens, prompt.extra_keys);
  if (!impl_->hybrid->has_snapshot(keys, keys.size() - 1)) return std::optional<std::vector<uint8_t>>();
  auto snapshot = impl_->hybrid->fetch_snapshot(keys, keys.size() - 1);
  if (!snapshot.ok()) return std::optional<std::vector<uint8_t>>();  // counted and logged: a miss
  return std::optional<std::vector<uint8_t>>(std::in_place, snapshot->data(), snapshot->data() + snapshot->size());
}

}  // namespace kvtier
