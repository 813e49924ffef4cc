#include "server/tenant_table.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/byte_size.h"
#include "base/text/client_text.h"

namespace kvtier {

Result<std::string> namespace_of(const Tenant* t, const std::string& requested) {
  if (!t) return permission_denied("unknown key");
  if (requested.empty()) {
    if (t->admin) return requested;
    if (auto ns = t->default_namespace()) return *ns;
    return invalid_argument("name the namespace: this key may use several");
  }
  if (!t->may_use(requested)) {
    return permission_denied("this key may not use namespace '" + escaped_text(requested, 64) + "'");
  }
  return requested;
}
namespace {

using nlohmann::json;

std::array<uint8_t, 32> sha256(std::string_view s) {
  std::array<uint8_t, 32> d{};
  SHA256(reinterpret_cast<const unsigned char*>(s.data()), s.size(), d.data());
  return d;
}

Result<std::array<uint8_t, 32>> digest_from_hex(std::string_view hex) {
  std::array<uint8_t, 32> d{};
  if (hex.size() != 64) return invalid_argument("key_sha256 must be 64 hex digits");
  for (size_t i = 0; i < 32; ++i) {
    unsigned v = 0;
    for (char c : hex.substr(2 * i, 2)) {
      v <<= 4;
      if (c >= '0' && c <= '9') v |= static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f') v |= static_cast<unsigned>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= static_cast<unsigned>(c - 'A' + 10);
      else return invalid_argument("key_sha256 must be 64 hex digits");
    }
    d[i] = static_cast<uint8_t>(v);
  }
  return d;
}

Result<std::optional<uint64_t>> quota_size(const json& q, const char* field, const std::string& ns) {
  if (!q.contains(field)) return std::optional<uint64_t>();
  const json& v = q[field];
  if (v.is_number_unsigned()) return std::optional<uint64_t>(v.get<uint64_t>());
  if (!v.is_string()) return invalid_argument("quota of '" + ns + "': " + field + " must be a size like \"2G\"");
  auto n = parse_byte_size(v.get<std::string>());
  if (!n.ok()) return invalid_argument("quota of '" + ns + "': " + field + ": " + n.status().message());
  return std::optional<uint64_t>(*n);
}

}  // namespace

bool Tenant::may_use(std::string_view ns) const {
  if (admin) return true;
  for (const std::string& pattern : namespaces) {
    if (!pattern.empty() && pattern.back() == '*') {
      if (ns.substr(0, pattern.size() - 1) == std::string_view(pattern).substr(0, pattern.size() - 1)) return true;
    } else if (ns == pattern) {
      return true;
    }
  }
  return false;
}

std::optional<std::string> Tenant::default_namespace() const {
  if (namespaces.size() != 1 || namespaces[0].empty() || namespaces[0].back() == '*') return std::nullopt;
  return namespaces[0];
}

Result<TenantTable> TenantTable::parse(std::string_view text) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return invalid_argument("not a JSON object");
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() != "keys" && it.key() != "quotas") return invalid_argument("unknown key '" + it.key() + "'");
  }
  if (!j.contains("keys") || !j["keys"].is_array() || j["keys"].empty()) {
    return invalid_argument("'keys' must be a non-empty array");
  }
  TenantTable table;
  std::set<TenantTable::Digest> seen;
  for (size_t i = 0; i < j["keys"].size(); ++i) {
    const json& k = j["keys"][i];
    const std::string where = "keys[" + std::to_string(i) + "]";
    if (!k.is_object()) return invalid_argument(where + " must be an object");
    for (auto it = k.begin(); it != k.end(); ++it) {
      static const std::set<std::string> kFields = {"tenant", "key", "key_sha256", "namespaces", "admin"};
      if (!kFields.count(it.key())) return invalid_argument(where + ": unknown field '" + it.key() + "'");
    }
    auto tenant = std::make_shared<Tenant>();
    if (!k.contains("tenant") || !k["tenant"].is_string() || k["tenant"].get<std::string>().empty()) {
      return invalid_argument(where + ": 'tenant' (a name for logs and metrics) is required");
    }
    tenant->name = k["tenant"].get<std::string>();
    tenant->admin = k.value("admin", false);
    if (k.contains("namespaces")) {
      if (!k["namespaces"].is_array()) return invalid_argument(where + ": 'namespaces' must be an array of names");
      for (const json& ns : k["namespaces"]) {
        if (!ns.is_string() || ns.get<std::string>().empty()) {
          return invalid_argument(where + ": 'namespaces' must be an array of non-empty names");
        }
        tenant->namespaces.push_back(ns.get<std::string>());
      }
    }
    if (!tenant->admin && tenant->namespaces.empty()) {
      return invalid_argument(where + " (" + tenant->name + "): a key that is not admin needs 'namespaces'");
    }
    Digest digest{};
    const bool has_key = k.contains("key"), has_digest = k.contains("key_sha256");
    if (has_key == has_digest) return invalid_argument(where + " (" + tenant->name + "): give exactly one of 'key' and 'key_sha256'");
    if (has_key) {
      if (!k["key"].is_string() || k["key"].get<std::string>().size() < 16) {
        return invalid_argument(where + " (" + tenant->name + "): 'key' must be a string of at least 16 characters");
      }
      digest = sha256(k["key"].get<std::string>());
    } else {
      if (!k["key_sha256"].is_string()) return invalid_argument(where + ": key_sha256 must be 64 hex digits");
      auto d = digest_from_hex(k["key_sha256"].get<std::string>());
      if (!d.ok()) return d.status().with_context(where + " (" + tenant->name + ")");
      digest = *d;
    }
    if (!seen.insert(digest).second) return invalid_argument(where + " (" + tenant->name + "): the same key is listed twice");
    table.keys_.push_back({digest, std::move(tenant)});
  }
  if (j.contains("quotas")) {
    if (!j["quotas"].is_object()) return invalid_argument("'quotas' must map namespaces to {\"ram\", \"ssd\"}");
    for (auto it = j["quotas"].begin(); it != j["quotas"].end(); ++it) {
      const json& q = it.value();
      if (!q.is_object()) return invalid_argument("quota of '" + it.key() + "' must be an object");
      for (auto f = q.begin(); f != q.end(); ++f) {
        if (f.key() != "ram" && f.key() != "ssd") {
          return invalid_argument("quota of '" + it.key() + "': unknown field '" + f.key() + "' (ram, ssd)");
        }
      }
      NamespaceQuota quota;
      KVTIER_ASSIGN_OR_RETURN(quota.ram_bytes, quota_size(q, "ram", it.key()));
      KVTIER_ASSIGN_OR_RETURN(quota.ssd_bytes, quota_size(q, "ssd", it.key()));
      table.quotas_.emplace(it.key(), quota);
    }
  }
  return table;
}

Result<TenantTable> TenantTable::load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return invalid_argument("cannot read " + path);
  std::stringstream text;
  text << in.rdbuf();
  auto table = parse(text.str());
  if (!table.ok()) return table.status().with_context(path);
  return table;
}

TenantTable TenantTable::single_admin_key(std::string_view key) {
  TenantTable table;
  auto tenant = std::make_shared<Tenant>();
  tenant->name = "admin";
  tenant->admin = true;
  table.keys_.push_back({sha256(key), std::move(tenant)});
  return table;
}

const Tenant* TenantTable::authenticate(std::string_view key) const {
  if (key.empty()) return nullptr;
  const Digest given = sha256(key);
  const Tenant* found = nullptr;
  // Every digest is compared, match or not: the time does not say which key (or how much of one) matched.
  for (const Key& k : keys_) {
    const bool match = CRYPTO_memcmp(given.data(), k.digest.data(), given.size()) == 0;
    if (match) found = k.tenant.get();
  }
  return found;
}

}  // namespace kvtier
