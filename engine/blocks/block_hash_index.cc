#include "engine/blocks/block_hash_index.h"

#include <algorithm>
#include <bit>
#include <cassert>

namespace kvtier {

BlockHashIndex::BlockHashIndex(size_t max_entries) {
  // At most half full: linear probing's runs stay a few entries long.
  const size_t slots = std::bit_ceil(std::max<size_t>(16, 2 * max_entries));
  entries_.resize(slots);
  mask_ = slots - 1;
  shift_ = 64 - std::countr_zero(slots);
  assert(shift_ >= 32);  // the hasher's top 32 bits are its mix's own
}

size_t BlockHashIndex::home(const BlockHash& hash) const {
  // The process's hash-table hasher (serialize/block_hash.h: all four words times factors no
  // client knows), its top bits: multiply-shift.
  return BlockHashHasher{}(hash) >> shift_;
}

int32_t BlockHashIndex::find(const BlockHash& hash) const {
  for (size_t i = home(hash);; i = next(i)) {
    const Entry& e = entries_[i];
    if (e.id < 0) return -1;
    if (e.hash == hash) return e.id;
  }
}

void BlockHashIndex::insert(const BlockHash& hash, int32_t id) {
  assert(id >= 0 && size_ < entries_.size() / 2);
  size_t i = home(hash);
  while (entries_[i].id >= 0) {
    assert(entries_[i].hash != hash);
    i = next(i);
  }
  entries_[i] = {hash, id};
  ++size_;
}

bool BlockHashIndex::erase(const BlockHash& hash) {
  size_t i = home(hash);
  while (true) {
    if (entries_[i].id < 0) return false;
    if (entries_[i].hash == hash) break;
    i = next(i);
  }
  // Backward shift: each later entry of the run moves into the hole if its home is not between
  // the hole and itself, so a find never stops early at an empty slot (no tombstones).
  size_t hole = i;
  for (size_t j = next(hole);; j = next(j)) {
    if (entries_[j].id < 0) break;
    const size_t h = home(entries_[j].hash);
    const bool home_in_gap = hole <= j ? (hole < h && h <= j) : (hole < h || h <= j);
    if (home_in_gap) continue;
    entries_[hole] = entries_[j];
    hole = j;
  }
  entries_[hole] = Entry{};
  --size_;
  return true;
}

}  // namespace kvtier
