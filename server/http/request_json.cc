#include "server/http/request_json.h"

#include <algorithm>
#include <limits>

#include "base/text/client_text.h"

namespace kvtier {
namespace {

using nlohmann::json;

// A request body read in one SAX pass straight into compact fields: token ids into a u32 array,
// hashes into 32-byte values. No document is built, so what a body costs in memory is bounded by
// its length (a 16 MiB body of 8.4M tokens built a 765 MiB document before), nesting cannot go
// deeper than a request's two levels, and the pass stops at the first wrong value or the first
// element past a limit.
class RequestReader final : public nlohmann::json_sax<json> {
 public:
  enum class Field { kNamespace, kTokens, kExtraKeys, kHashes };
  RequestReader(std::initializer_list<std::pair<const char*, Field>> fields, size_t max_elements)
      : fields_(fields), max_elements_(max_elements) {}

  Status read(const std::string& body) {
    // Each token takes two bytes of the body at least ("1,"): one allocation, not doublings.
    for (const auto& [name, f] : fields_) {
      if (f == Field::kTokens) tokens.reserve(std::min(prompt_token_capacity(body.size()), max_elements_));
    }
    const bool parsed = json::sax_parse(body, this, json::input_format_t::json, /*strict=*/true);
    if (!status_.ok()) return status_;
    if (!parsed) return invalid_argument("the body is not valid JSON");
    return ok_status();
  }
  bool has(Field f) const { return seen_[static_cast<size_t>(f)]; }

  std::string ns;
  std::vector<uint32_t> tokens;
  std::vector<std::string> extra_keys;
  std::vector<BlockHash> hashes;

  bool null() override { return value("null"); }
  bool boolean(bool v) override { return value(v ? "true" : "false"); }
  bool number_integer(number_integer_t v) override {
    if (v >= 0) return number_unsigned(static_cast<number_unsigned_t>(v));
    return value(std::to_string(v));
  }
  bool number_unsigned(number_unsigned_t v) override {
    if (depth_ == 2 && field_ == Field::kTokens && v <= std::numeric_limits<uint32_t>::max()) {
      if (!room(tokens.size())) return false;
      tokens.push_back(static_cast<uint32_t>(v));
      return true;
    }
    return value(std::to_string(v));
  }
  bool number_float(number_float_t, const string_t& text) override { return value(escaped_text(text, 64)); }
  bool string(string_t& v) override {
    if (depth_ == 1 && field_ == Field::kNamespace) {
      ns = std::move(v);
      return true;
    }
    if (depth_ == 2 && field_ == Field::kExtraKeys) {
      if (!room(extra_keys.size())) return false;
      extra_keys.push_back(std::move(v));
      return true;
    }
    if (depth_ == 2 && field_ == Field::kHashes) {
      if (!room(hashes.size())) return false;
      auto parsed = BlockHash::from_hex(v);
      if (!parsed.ok()) return fail(invalid_argument("'hashes': " + parsed.status().message()));
      hashes.push_back(*parsed);
      return true;
    }
    return value(escaped_text(json_text(json(v)), 64));
  }
  bool binary(binary_t&) override { return value("binary"); }
  bool key(string_t& k) override {
    for (const auto& [name, f] : fields_) {
      if (k != name) continue;
      field_ = f;
      seen_[static_cast<size_t>(f)] = true;
      // A repeated field counts once, as its last value.
      if (f == Field::kTokens) tokens.clear();
      if (f == Field::kExtraKeys) extra_keys.clear();
      if (f == Field::kHashes) hashes.clear();
      return true;
    }
    return fail(invalid_argument("unknown field '" + escaped_text(k, 64) + "'"));
  }
  bool start_object(std::size_t) override {
    if (depth_ == 0) return ++depth_ > 0;
    return depth_ >= 2 ? too_deep() : value("an object");
  }
  bool end_object() override {
    --depth_;
    return true;
  }
  bool start_array(std::size_t) override {
    if (depth_ == 1 && field_ != Field::kNamespace) return ++depth_ > 0;
    return depth_ >= 2 ? too_deep() : value("an array");
  }
  bool end_array() override {
    --depth_;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

 private:
  // A value where the request has no place for it (`shown` as the client wrote it).
  bool value(const std::string& shown) {
    if (depth_ == 0) return fail(invalid_argument("the body is not a JSON object"));
    switch (field_) {
      case Field::kNamespace: return fail(invalid_argument("'namespace' must be a string"));
      case Field::kTokens:
        return fail(invalid_argument(depth_ == 1 ? "'tokens' must be an array of token ids"
                                                 : "'tokens' holds " + shown + ", not a token id (0 .. 2^32-1)"));
      case Field::kExtraKeys:
        return fail(invalid_argument(depth_ == 1 ? "'extra_keys' must be an array of strings"
                                                 : "'extra_keys' holds " + shown + ", not a string"));
      case Field::kHashes:
        return fail(invalid_argument(depth_ == 1 ? "'hashes' must be an array of 64-digit hex hashes"
                                                 : "'hashes' holds " + shown + ", not a string"));
    }
    return false;
  }
  bool too_deep() {
    return fail(invalid_argument("the body nests arrays or objects deeper than kvtierd's requests, which use 2 levels"));
  }
  bool room(size_t held) {
    if (held < max_elements_) return true;
    const char* what = field_ == Field::kTokens ? "tokens" : field_ == Field::kHashes ? "hashes" : "extra keys";
    return fail(Status(StatusCode::kResourceExhausted, std::string("the request holds more than ") +
                                                           std::to_string(max_elements_) + " " + what +
                                                           "; at most " + std::to_string(max_elements_) +
                                                           " are accepted (docs/limits.md)"));
  }
  bool fail(Status st) {
    status_ = std::move(st);
    return false;
  }

  const std::vector<std::pair<const char*, Field>> fields_;
  const size_t max_elements_;
  size_t depth_ = 0;
  Field field_ = Field::kNamespace;
  bool seen_[4] = {false, false, false, false};
  Status status_;
};

}  // namespace

size_t prompt_token_capacity(size_t body_bytes) { return std::min(body_bytes / 2 + 1, kMaxPromptTokens); }

Result<PromptRequest> parse_prompt_request(const std::string& body) {
  using F = RequestReader::Field;
  RequestReader r({{"namespace", F::kNamespace}, {"tokens", F::kTokens}, {"extra_keys", F::kExtraKeys}},
                  kMaxPromptTokens);
  KVTIER_RETURN_IF_ERROR(r.read(body));
  if (!r.has(F::kTokens)) return invalid_argument("missing field 'tokens'");
  PromptRequest out;
  out.ns = std::move(r.ns);  // may be left out: the door's default applies (HttpApi::namespace_for)
  out.tokens = std::move(r.tokens);
  out.extra_keys = std::move(r.extra_keys);
  return out;
}

Result<BatchGetRequest> parse_batch_get_request(const std::string& body, size_t max_hashes) {
  using F = RequestReader::Field;
  RequestReader r({{"namespace", F::kNamespace}, {"hashes", F::kHashes}}, max_hashes);
  if (Status st = r.read(body); !st.ok()) {
    // Too many hashes is the client's request shape, answered as before: 400.
    if (st.code() == StatusCode::kResourceExhausted) return invalid_argument(st.message());
    return st;
  }
  if (!r.has(F::kHashes)) return invalid_argument("'hashes' must be an array of 64-digit hex hashes");
  BatchGetRequest out;
  out.ns = std::move(r.ns);
  out.hashes = std::move(r.hashes);
  return out;
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
