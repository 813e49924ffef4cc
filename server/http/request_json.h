// The JSON bodies of kvtierd's control routes, parsed strictly: a wrong type, a token that is not
// a u32, or an unknown field is a kInvalidArgument that names the field, so a client's typo is a
// 400 that says what is wrong rather than a silent miss.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/block_service.h"

namespace kvtier {

// {"namespace": "...", "tokens": [u32...], "extra_keys": ["..."]} (namespace and extra_keys
// optional). More than kMaxPromptTokens tokens is kResourceExhausted (answered 413).
Result<PromptRequest> parse_prompt_request(const std::string& body);
// {"hashes": ["hex"...], "namespace": "..."} (namespace optional)
struct BatchGetRequest {
  std::vector<BlockHash> hashes;
  std::string ns;
};
Result<BatchGetRequest> parse_batch_get_request(const std::string& body, size_t max_hashes);

// The tokens a prompt body of `body_bytes` can hold (two bytes each at least, "1,"), up to
// kMaxPromptTokens: what parse_prompt_request sizes its array for.
size_t prompt_token_capacity(size_t body_bytes);
// Tokens one lookup or prefetch may name: 1M, past every model's context today. Bounded so that a
// body within the size limit cannot ask for unbounded work and memory (a 16 MiB body holds 8.4M).
inline constexpr size_t kMaxPromptTokens = size_t{1} << 20;
// What the reply to a lookup costs per block while it is built and sent (the JSON document and
// its text), taken from the body budget with the tokens' own 4 bytes.
inline constexpr uint64_t kLookupReplyBytesPerBlock = 1024;

nlohmann::json to_json(const LookupReply& reply);
nlohmann::json to_json(const PrefetchReply& reply);
// {"error": {"code", "message"}}: the body of every refusal on both doors. The message is escaped
// (base/text/client_text.h) and cut to kMaxMessageBytes, so it is always encodable.
inline constexpr size_t kMaxMessageBytes = 2048;
nlohmann::json error_json(std::string_view code, std::string_view message);
// The encoding of a reply: never throws (invalid UTF-8 becomes U+FFFD), unlike json::dump().
std::string json_text(const nlohmann::json& value);

}  // namespace kvtier
