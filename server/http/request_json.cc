#include "server/http/request_json.h"

#include <limits>

namespace kvtier {
namespace {

using nlohmann::json;

Result<json> parse_object(const std::string& body) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_argument("the body is not valid JSON");
  if (!j.is_object()) return invalid_argument("the body is not a JSON object");
  return j;
}

Status only_fields(const json& j, std::initializer_list<const char*> allowed) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (std::find_if(allowed.begin(), allowed.end(), [&](const char* a) { return it.key() == a; }) ==
        allowed.end()) {
      return invalid_argument("unknown field '" + it.key() + "'");
    }
  }
  return ok_status();
}

Result<std::string> namespace_field(const json& j, bool required) {
  auto it = j.find("namespace");
  if (it == j.end()) {
    if (required) return invalid_argument("missing field 'namespace'");
    return std::string();
  }
  if (!it->is_string()) return invalid_argument("'namespace' must be a string");
  return it->get<std::string>();
}

}  // namespace

Result<PromptRequest> parse_prompt_request(const std::string& body) {
  KVTIER_ASSIGN_OR_RETURN(json j, parse_object(body));
  KVTIER_RETURN_IF_ERROR(only_fields(j, {"namespace", "tokens", "extra_keys"}));
  PromptRequest r;
  KVTIER_ASSIGN_OR_RETURN(r.ns, namespace_field(j, true));
  auto tokens = j.find("tokens");
  if (tokens == j.end()) return invalid_argument("missing field 'tokens'");
  if (!tokens->is_array()) return invalid_argument("'tokens' must be an array of token ids");
  r.tokens.reserve(tokens->size());
  for (const json& t : *tokens) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
        t.get<int64_t>() > std::numeric_limits<uint32_t>::max()) {
      return invalid_argument("'tokens' holds " + t.dump() + ", not a token id (0 .. 2^32-1)");
    }
    r.tokens.push_back(static_cast<uint32_t>(t.get<int64_t>()));
  }
  if (auto extra = j.find("extra_keys"); extra != j.end()) {
    if (!extra->is_array()) return invalid_argument("'extra_keys' must be an array of strings");
    for (const json& k : *extra) {
      if (!k.is_string()) return invalid_argument("'extra_keys' holds " + k.dump() + ", not a string");
      r.extra_keys.push_back(k.get<std::string>());
    }
  }
  return r;
}

Result<BatchGetRequest> parse_batch_get_request(const std::string& body, size_t max_hashes) {
  KVTIER_ASSIGN_OR_RETURN(json j, parse_object(body));
  KVTIER_RETURN_IF_ERROR(only_fields(j, {"namespace", "hashes"}));
  BatchGetRequest r;
  KVTIER_ASSIGN_OR_RETURN(r.ns, namespace_field(j, false));
  auto hashes = j.find("hashes");
  if (hashes == j.end() || !hashes->is_array()) {
    return invalid_argument("'hashes' must be an array of 64-digit hex hashes");
  }
  if (hashes->size() > max_hashes) {
    return invalid_argument("'hashes' names " + std::to_string(hashes->size()) + " blocks; at most " +
                            std::to_string(max_hashes) + " per request");
  }
  for (const json& h : *hashes) {
    if (!h.is_string()) return invalid_argument("'hashes' holds " + h.dump() + ", not a string");
    auto parsed = BlockHash::from_hex(h.get<std::string>());
    if (!parsed.ok()) return invalid_argument("'hashes': " + parsed.status().message());
    r.hashes.push_back(*parsed);
  }
  return r;
}

json to_json(const LookupReply& reply) {
  json blocks = json::array(), missing = json::array();
  for (const auto& b : reply.blocks) blocks.push_back({{"hash", b.hash.hex()}, {"tier", b.tier}});
  for (const auto& m : reply.missing) {
    missing.push_back({{"hash", m.hash.hex()}, {"parent_hash", m.parent_hash.hex()}});
  }
  return {{"matched_tokens", reply.matched_tokens}, {"blocks", blocks}, {"missing", missing}};
}

json to_json(const PrefetchReply& r) {
  return {{"matched_tokens", r.matched_tokens},
          {"already_warm", r.already_warm},
          {"prefetched", r.prefetched},
          {"failed", r.failed}};
}

json error_json(std::string_view code, std::string_view message) {
  return {{"error", {{"code", code}, {"message", message}}}};
}

}  // namespace kvtier
