// The JSON bodies of kvtierd's control routes, parsed strictly: a wrong type, a token that is not
// a u32, or an unknown field is a kInvalidArgument that names the field, so a client's typo is a
// 400 that says what is wrong rather than a silent miss.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/block_service.h"

namespace kvtier {

// {"namespace": "...", "tokens": [u32...], "extra_keys": ["..."]} (extra_keys optional)
Result<PromptRequest> parse_prompt_request(const std::string& body);
// {"hashes": ["hex"...], "namespace": "..."} (namespace optional)
struct BatchGetRequest {
  std::vector<BlockHash> hashes;
  std::string ns;
};
Result<BatchGetRequest> parse_batch_get_request(const std::string& body, size_t max_hashes);

nlohmann::json to_json(const LookupReply& reply);
nlohmann::json to_json(const PrefetchReply& reply);
nlohmann::json error_json(std::string_view code, std::string_view message);

}  // namespace kvtier
