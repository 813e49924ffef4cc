#include "tiers/remote/redis_address.h"

#include <charconv>

namespace kvtier {
namespace {

// %XX escapes in the user info, so a password may hold ':' '@' ','.
Result<std::string> unescape(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out += s[i];
      continue;
    }
    int v = 0;
    if (i + 2 >= s.size() || std::from_chars(s.data() + i + 1, s.data() + i + 3, v, 16).ptr != s.data() + i + 3) {
      return invalid_argument("bad %-escape in the user info");
    }
    out += static_cast<char>(v);
    i += 2;
  }
  return out;
}

}  // namespace

Result<RedisAddress> RedisAddress::parse(std::string_view url) {
  constexpr std::string_view kScheme = "redis://";
  if (url.substr(0, kScheme.size()) != kScheme) {
    return invalid_argument("a remote address starts with redis:// (got '" + std::string(url.substr(0, 16)) + "...')");
  }
  std::string_view rest = url.substr(kScheme.size());
  while (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  RedisAddress a;
  if (const size_t at = rest.rfind('@'); at != std::string_view::npos) {
    std::string_view info = rest.substr(0, at);
    rest = rest.substr(at + 1);
    const size_t colon = info.find(':');
    if (colon == std::string_view::npos) {
      return invalid_argument("redis:// user info must be user:password or :password");
    }
    KVTIER_ASSIGN_OR_RETURN(a.user, unescape(info.substr(0, colon)));
    KVTIER_ASSIGN_OR_RETURN(a.password, unescape(info.substr(colon + 1)));
  }
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    std::string_view hp = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    const size_t colon = hp.rfind(':');
    RedisEndpoint e;
    e.host = std::string(hp.substr(0, colon));
    if (colon != std::string_view::npos) {
      std::string_view p = hp.substr(colon + 1);
      if (std::from_chars(p.data(), p.data() + p.size(), e.port).ptr != p.data() + p.size() || e.port <= 0 ||
          e.port > 65535) {
        return invalid_argument("bad port in '" + std::string(hp) + "'");
      }
    }
    if (e.host.empty()) return invalid_argument("empty host in the remote address");
    a.seeds.push_back(std::move(e));
  }
  if (a.seeds.empty()) return invalid_argument("the remote address names no host");
  return a;
}

std::string RedisAddress::redacted() const {
  std::string out = "redis://";
  if (!password.empty()) out += user + ":***@";
  for (size_t i = 0; i < seeds.size(); ++i) {
    if (i > 0) out += ',';
    out += seeds[i].text();
  }
  return out;
}

}  // namespace kvtier
