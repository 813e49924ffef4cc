// TenantTable: who may do what on kvtierd. Each API key belongs to a named tenant that may read
// and write only its namespaces; an admin key may also read stats and metrics and delete any
// block. Keys are held as SHA-256 digests and compared in constant time; only tenant names ever
// reach a log. `--api-keys FILE` loads a table; `--api-key` is the one-admin-key case.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace kvtier {

struct Tenant {
  std::string name;
  bool admin = false;  // every namespace, stats, metrics, deletes
  // Exact names, or "prefix*" for every namespace starting with prefix.
  std::vector<std::string> namespaces;

  bool may_use(std::string_view ns) const;
  // The namespace a request that names none means: the tenant's only exact one, if it has one.
  std::optional<std::string> default_namespace() const;
};

// Byte limits of one namespace in each tier (absent: no limit). A RAM quota refuses PUTs past it
// (507); an SSD quota refuses spills past it (the block leaves the cache when RAM evicts it).
struct NamespaceQuota {
  std::optional<uint64_t> ram_bytes;
  std::optional<uint64_t> ssd_bytes;
};

// The namespace a request of `tenant` acts in: `requested` if the tenant may use it, its only
// namespace when it names none (an admin's empty request stays empty: every namespace);
// kPermissionDenied or kInvalidArgument otherwise. For servers with auth on (`tenant` null: an
// unknown key).
Result<std::string> namespace_of(const Tenant* tenant, const std::string& requested);

class TenantTable {
 public:
  // {"keys": [{"tenant": "a", "key": "…" | "key_sha256": "<hex>", "namespaces": ["a", "a-*"],
  //            "admin": false}, …],
  //  "quotas": {"a": {"ram": "2G"}, …}}
  static Result<TenantTable> parse(std::string_view json_text);
  static Result<TenantTable> load(const std::string& path);
  // The `--api-key` case: one key, admin.
  static TenantTable single_admin_key(std::string_view key);

  // The key's tenant, or nullptr for an unknown key. Takes the same time whichever key matches.
  const Tenant* authenticate(std::string_view key) const;
  bool empty() const { return keys_.empty(); }
  size_t key_count() const { return keys_.size(); }
  const std::map<std::string, NamespaceQuota, std::less<>>& quotas() const { return quotas_; }

 private:
  using Digest = std::array<uint8_t, 32>;
  struct Key {
    Digest digest;
    std::shared_ptr<const Tenant> tenant;
  };
  std::vector<Key> keys_;
  std::map<std::string, NamespaceQuota, std::less<>> quotas_;
};

}  // namespace kvtier
