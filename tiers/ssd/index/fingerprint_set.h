// FingerprintSet: which blocks the SSD index holds, in memory, as 8-byte fingerprints of their
// hashes in one open-addressed table (linear probing, deletion by backward shift: no tombstones,
// so a table that churns for days probes as short as a fresh one). 16-32 bytes per block, where a
// node-based set costs ~50; a lookup touches one or two cache lines.
//
// Two hashes share a fingerprint with probability 2^-64 per pair: contains() may then say yes for
// a block the index does not hold. A lookup's yes is checked again (the read goes through the
// index, which finds nothing); SsdTier::insert takes a yes as "already present" and skips the
// write, so a shared fingerprint there would cost that block its SSD copy, which at 2^-64 per
// pair is left to chance, but must not be anyone's choice. The fingerprint is SipHash-1-3 of the
// hash under a key drawn when the process starts: block hashes come from clients (PUT), and with a
// rule a client can work out (it was the words' XOR, then for a while a keyed multiply-and-xorshift
// whose top-bit differences still cancelled) one could send a hash sharing another block's
// fingerprint, and the SSD tier took that block for written already (its spill refused as present)
// and forgot it when the other was deleted. Not thread-safe: its owner locks.
#pragma once

#include <cstdint>
#include <vector>

#include "base/hashing/keyed_hash.h"
#include "serialize/block_hash.h"

namespace kvtier {

class FingerprintSet {
 public:
  static uint64_t fingerprint(const BlockHash& h) {
    static const SipKey key = SipKey::draw();
    const uint64_t f = siphash13(h.bytes, key);
    return f == kEmpty ? 1 : f;  // 0 marks an empty slot
  }

  bool contains(uint64_t f) const {
    if (slots_.empty()) return false;
    for (size_t i = home(f);; i = next(i)) {
      if (slots_[i] == f) return true;
      if (slots_[i] == kEmpty) return false;
    }
  }

  void insert(uint64_t f) {
    if ((size_ + 1) * 2 > slots_.size()) grow();
    size_t i = home(f);
    for (; slots_[i] != kEmpty; i = next(i)) {
      if (slots_[i] == f) return;
    }
    slots_[i] = f;
    ++size_;
  }

  void erase(uint64_t f) {
    if (slots_.empty()) return;
    size_t i = home(f);
    for (; slots_[i] != f; i = next(i)) {
      if (slots_[i] == kEmpty) return;
    }
    // Backward shift: later entries of the run move into the hole when their home allows, so
    // every entry stays reachable from its home without a tombstone.
    for (size_t j = next(i);; j = next(j)) {
      if (slots_[j] == kEmpty) break;
      const size_t h = home(slots_[j]);
      const bool movable = i <= j ? (h <= i || h > j) : (h <= i && h > j);
      if (movable) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i] = kEmpty;
    --size_;
  }

  size_t size() const { return size_; }
  size_t memory_bytes() const { return slots_.size() * sizeof(uint64_t); }

 private:
  static constexpr uint64_t kEmpty = 0;
  size_t home(uint64_t f) const {
    return static_cast<size_t>((f * 0x9E3779B97F4A7C15ull) >> shift_);
  }
  size_t next(size_t i) const { return (i + 1) & (slots_.size() - 1); }

  void grow() {
    std::vector<uint64_t> old = std::move(slots_);
    const size_t n = old.empty() ? 1024 : old.size() * 2;
    slots_.assign(n, kEmpty);
    shift_ = 64 - static_cast<int>(__builtin_ctzll(n));
    size_ = 0;
    for (uint64_t f : old) {
      if (f != kEmpty) insert(f);
    }
  }

  std::vector<uint64_t> slots_;
  int shift_ = 64;
  size_t size_ = 0;
};

}  // namespace kvtier
