#include "base/byte_size.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace kvtier {

Result<uint64_t> parse_byte_size(std::string_view text) {
  auto bad = [&](std::string_view why) {
    return invalid_argument("size '" + std::string(text) + "': " + std::string(why) +
                            " (examples: 4096, 512M, 8G, 1.5T)");
  };
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  if (i == 0) return bad("expected a number");
  double number = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + i, number);
  if (ec != std::errc() || ptr != text.data() + i) return bad("not a number");

  std::string suffix;
  for (char c : text.substr(i)) suffix += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (!suffix.empty() && suffix.back() == 'B' && suffix.size() > 1) suffix.pop_back();
  if (!suffix.empty() && suffix.back() == 'I') suffix.pop_back();
  double mult = 1;
  if (suffix.empty() || suffix == "B") mult = 1;
  else if (suffix == "K") mult = 1024.0;
  else if (suffix == "M") mult = 1024.0 * 1024;
  else if (suffix == "G") mult = 1024.0 * 1024 * 1024;
  else if (suffix == "T") mult = 1024.0 * 1024 * 1024 * 1024;
  else return bad("unknown suffix");
  double bytes = std::floor(number * mult);
  if (bytes > 1.8e19) return bad("too large");
  return static_cast<uint64_t>(bytes);
}

std::string format_byte_size(uint64_t bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (u == 0) std::snprintf(buf, sizeof(buf), "%llu B", static_cast<unsigned long long>(bytes));
  else std::snprintf(buf, sizeof(buf), "%.2f %s", v, units[u]);
  return buf;
}

}  // namespace kvtier
