// LayoutRegistry: the layouts a process knows, by fingerprint. A stored block names its layout
// only by fingerprint; decoding asks the registry for the shape to check the block against.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "serialize/kv_layout.h"

namespace kvtier {

// Thread-safe.
class LayoutRegistry {
 public:
  // Registers `layout` (validated) and returns the shared copy every block of it will point to.
  // Registering an equal layout again returns the existing copy.
  Result<std::shared_ptr<const KvLayout>> add(const KvLayout& layout);
  // nullptr when unknown.
  std::shared_ptr<const KvLayout> find(uint64_t fingerprint) const;
  std::vector<std::shared_ptr<const KvLayout>> all() const;

 private:
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, std::shared_ptr<const KvLayout>> by_fingerprint_;
};

}  // namespace kvtier
