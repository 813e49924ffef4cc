#include "base/text/client_text.h"

#include <cstdint>

namespace kvtier {
namespace {

// The length of the well-formed UTF-8 sequence that starts `s` at `i`, or 0 when the byte there
// does not start one (RFC 3629's table: the second byte's range depends on the first).
size_t utf8_sequence(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[i + k]); };
  const uint8_t c = b(0);
  if (c < 0x80) return 1;
  size_t n = 0;
  uint8_t lo = 0x80, hi = 0xbf;
  if (c >= 0xc2 && c <= 0xdf) n = 2;
  else if (c == 0xe0) n = 3, lo = 0xa0;
  else if (c == 0xed) n = 3, hi = 0x9f;  // no UTF-16 surrogates
  else if (c >= 0xe1 && c <= 0xef) n = 3;
  else if (c == 0xf0) n = 4, lo = 0x90;
  else if (c == 0xf4) n = 4, hi = 0x8f;  // nothing past U+10FFFF
  else if (c >= 0xf1 && c <= 0xf3) n = 4;
  else return 0;
  if (i + n > s.size()) return 0;
  if (b(1) < lo || b(1) > hi) return 0;
  for (size_t k = 2; k < n; ++k) {
    if (b(k) < 0x80 || b(k) > 0xbf) return 0;
  }
  return n;
}

}  // namespace

bool is_valid_utf8(std::string_view bytes) {
  for (size_t i = 0; i < bytes.size();) {
    const size_t n = utf8_sequence(bytes, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string escaped_text(std::string_view bytes, size_t max_bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  const std::string_view shown = bytes.substr(0, max_bytes);
  std::string out;
  out.reserve(shown.size() + 16);
  for (size_t i = 0; i < shown.size();) {
    const auto c = static_cast<uint8_t>(shown[i]);
    const size_t n = utf8_sequence(shown, i);
    if (n > 1) {
      out.append(shown.substr(i, n));
      i += n;
      continue;
    }
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (n == 1 && c >= 0x20 && c != 0x7f) out += static_cast<char>(c);
    else out += {'\\', 'x', kHex[c >> 4], kHex[c & 15]};
    ++i;
  }
  if (bytes.size() > shown.size()) out += "...(" + std::to_string(bytes.size()) + " bytes)";
  return out;
}

}  // namespace kvtier
