// Client bytes inside our own messages. A request's path, namespace or JSON key can hold any
// bytes; copied as they are into an error reply or a log line they broke the JSON encoder (which
// throws on invalid UTF-8) and let a client forge log lines with a newline. Every message that
// quotes a client goes through these: valid UTF-8 stays readable, anything else is escaped.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace kvtier {

// True when `bytes` is well-formed UTF-8 (no overlong forms, surrogates or code points past
// U+10FFFF), the rule JSON encoders and Python's str apply.
bool is_valid_utf8(std::string_view bytes);

// `bytes` as text that is valid UTF-8 with no control characters: ASCII controls, DEL and every
// byte that is not part of a well-formed UTF-8 sequence become \xNN (or \n, \t). At most
// `max_bytes` of the input are shown; a longer input ends in "...(N bytes)". Never throws.
// Idempotent, so a message escaped where it quotes a client can be escaped again as a whole.
std::string escaped_text(std::string_view bytes, size_t max_bytes = 256);

}  // namespace kvtier
