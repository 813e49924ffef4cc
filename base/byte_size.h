// Byte sizes as people write them on command lines and in config files: "512M", "8G", "1.5T",
// "4096". Suffixes are binary (K = 1024) and case-insensitive; "KiB", "MB" and "GiB" forms are
// accepted with the same binary meaning.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "base/status.h"

namespace kvtier {

Result<uint64_t> parse_byte_size(std::string_view text);
// 2147483648 -> "2.00 GiB"
std::string format_byte_size(uint64_t bytes);

}  // namespace kvtier
