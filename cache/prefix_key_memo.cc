#include "cache/prefix_key_memo.h"

#include <algorithm>
#include <cstring>

namespace kvtier {

std::vector<BlockKey> PrefixKeyMemo::keys(std::span<const uint32_t> tokens,
                                          std::span<const std::string> extra_keys) {
  const size_t bs = static_cast<size_t>(hasher_.block_size());
  const size_t full = tokens.size() / bs;
  std::vector<BlockHash> hashes;
  {
    std::lock_guard lock(mu_);
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      // One prompt the other's prefix (a block's hash names every token before it): its hashes
      // are the first ones of the other's.
      const size_t common = std::min(it->tokens.size(), tokens.size());
      if (!std::equal(it->extra_keys.begin(), it->extra_keys.end(), extra_keys.begin(),
                      extra_keys.end()) ||
          (common > 0 &&
           std::memcmp(it->tokens.data(), tokens.data(), common * sizeof(uint32_t)) != 0)) {
        continue;
      }
      hashes.assign(it->hashes.begin(), it->hashes.begin() + static_cast<std::ptrdiff_t>(std::min(
                                                                 full, it->hashes.size())));
      entries_.splice(entries_.begin(), entries_, it);
      ++hits_;
      break;
    }
  }
  const size_t known = hashes.size();
  if (known < full) {  // the rest hashed outside the lock: the slow part
    hashes.reserve(full);
    BlockHash parent = known == 0 ? hasher_.root() : hashes.back();
    for (size_t i = known; i < full; ++i) {
      parent = hasher_.hash_block(parent, tokens.subspan(i * bs, bs), extra_keys);
      hashes.push_back(parent);
    }
    if (capacity_ > 0) {
      std::lock_guard lock(mu_);
      // The longer prompt is kept: the entry it extends (now first, if it was found) gives way.
      if (known > 0 && !entries_.empty() && entries_.front().hashes.size() == known &&
          std::equal(entries_.front().hashes.begin(), entries_.front().hashes.end(),
                     hashes.begin())) {
        entries_.pop_front();
      }
      entries_.push_front(Entry{std::vector<uint32_t>(tokens.begin(), tokens.end()),
                                std::vector<std::string>(extra_keys.begin(), extra_keys.end()),
                                hashes});
      if (entries_.size() > capacity_) entries_.pop_back();
    }
  }
  std::vector<BlockKey> out;
  out.reserve(full);
  for (size_t i = 0; i < full; ++i) out.push_back({hashes[i], tokens.subspan(i * bs, bs)});
  return out;
}

size_t PrefixKeyMemo::hits() const {
  std::lock_guard lock(mu_);
  return hits_;
}

}  // namespace kvtier
