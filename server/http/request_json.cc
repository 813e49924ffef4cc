#include "server/http/request_json.h"

#include <limits>

#include "base/text/client_text.h"

namespace kvtier {
namespace {

using nlohmann::json;

// A SAX pass that only measures nesting and stops at the first level past the limit, so a body
// of ten thousand '[' is refused before a document is built: nlohmann's serializer recurses once
// per level, and dumping such a document (into a message) overflowed a connection's stack.
class DepthCheck final : public nlohmann::json_sax<json> {
 public:
  explicit DepthCheck(size_t max_depth) : max_(max_depth) {}
  bool too_deep() const { return too_deep_; }

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool key(string_t&) override { return true; }
  bool start_object(std::size_t) override { return enter(); }
  bool end_object() override { return leave(); }
  bool start_array(std::size_t) override { return enter(); }
  bool end_array() override { return leave(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

 private:
  bool enter() {
    too_deep_ = ++depth_ > max_;
    return !too_deep_;
  }
  bool leave() {
    --depth_;
    return true;
  }
  const size_t max_;
  size_t depth_ = 0;
  bool too_deep_ = false;
};

// A JSON value a client sent, quoted in a message: short, and never more than one line.
std::string quoted(const json& value) { return escaped_text(json_text(value), 64); }

Result<json> parse_object(const std::string& body) {
  DepthCheck depth(kMaxJsonDepth);
  json::sax_parse(body, &depth, json::input_format_t::json, /*strict=*/true);
  if (depth.too_deep()) {
    return invalid_argument("the body nests arrays or objects deeper than " + std::to_string(kMaxJsonDepth) +
                            " levels; kvtierd's requests use at most 2");
  }
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_argument("the body is not valid JSON");
  if (!j.is_object()) return invalid_argument("the body is not a JSON object");
  return j;
}

Status only_fields(const json& j, std::initializer_list<const char*> allowed) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (std::find_if(allowed.begin(), allowed.end(), [&](const char* a) { return it.key() == a; }) ==
        allowed.end()) {
      return invalid_argument("unknown field '" + escaped_text(it.key(), 64) + "'");
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
      return invalid_argument("'tokens' holds " + quoted(t) + ", not a token id (0 .. 2^32-1)");
    }
    r.tokens.push_back(static_cast<uint32_t>(t.get<int64_t>()));
  }
  if (auto extra = j.find("extra_keys"); extra != j.end()) {
    if (!extra->is_array()) return invalid_argument("'extra_keys' must be an array of strings");
    for (const json& k : *extra) {
      if (!k.is_string()) return invalid_argument("'extra_keys' holds " + quoted(k) + ", not a string");
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
    if (!h.is_string()) return invalid_argument("'hashes' holds " + quoted(h) + ", not a string");
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
  json estimates = json::object();
  for (const auto& e : reply.load_estimates) {
    estimates[e.tier] = {{"blocks", e.blocks}, {"seconds", e.seconds ? json(*e.seconds) : json(nullptr)}};
  }
  return {{"matched_tokens", reply.matched_tokens},
          {"blocks", blocks},
          {"missing", missing},
          {"estimated_load", estimates}};
}

json to_json(const PrefetchReply& r) {
  return {{"matched_tokens", r.matched_tokens},
          {"already_warm", r.already_warm},
          {"prefetched", r.prefetched},
          {"failed", r.failed}};
}

json error_json(std::string_view code, std::string_view message) {
  // Messages quote clients (a path, a namespace): escaped here too, so no message can make the
  // reply unencodable, whatever a caller forgot.
  return {{"error", {{"code", code}, {"message", escaped_text(message, kMaxMessageBytes)}}}};
}

std::string json_text(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace kvtier
