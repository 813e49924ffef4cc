// MANIFEST.json of an SSD cache directory: what a later process must know before it trusts the
// directory — the format version, the segment size its files were cut to, and the layouts and
// namespaces of the blocks inside (so their documents can still be decoded after a restart with a
// different --layout). Written atomically (temp file, fsync, rename, fsync of the directory).
//
//   {"format": "kvtier.ssd", "version": 1, "created": "2026-11-22T14:00:00Z",
//    "segment_size": 268435456, "layouts": [<KvLayout JSON>...], "namespaces": ["llama-3-8b"],
//    "directories": ["/nvme0/kv", "/nvme1/kv"]}   (only when the cache spans several)
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/status.h"
#include "serialize/kv_layout.h"

namespace kvtier {

struct SsdManifest {
  static constexpr int kVersion = 1;
  int version = kVersion;
  std::string created;  // ISO 8601, UTC
  uint64_t segment_size = 0;
  std::vector<KvLayout> layouts;
  std::set<std::string> namespaces;
  // Every directory of the cache this one belongs to (several --ssd-cache-dir, one per drive),
  // so a restart can tell a drive that came back empty (its blocks are lost) from a new one.
  std::vector<std::string> directories;

  static SsdManifest fresh(uint64_t segment_size);
  // nullopt when the directory has no manifest (a new cache); kCorruption when it cannot be read.
  static Result<std::optional<SsdManifest>> load(const std::string& dir);
  Status save(const std::string& dir) const;

  // A directory written by another format version, or cut into segments of another size, cannot
  // be opened as is: the error says so and how to start over (--ssd-reset), it never wipes.
  Status check_compatible(const std::string& dir, uint64_t segment_size) const;
  // True when the layout (by fingerprint) was not yet recorded; adds it.
  bool add_layout(const KvLayout& layout);
};

}  // namespace kvtier
