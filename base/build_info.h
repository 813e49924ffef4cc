// What a binary was built from and with, for `--version` (kvtierd, kvtier, kvtier-fsck) and bug
// reports: the version, the git revision (with "-dirty" for uncommitted changes), the build type
// and sanitizer, the compiler, and the Vulkan loader and shader compiler found at configure time.
#pragma once

#include <string>

namespace kvtier {

struct BuildInfo {
  const char* version;
  const char* git_revision;
  const char* build_type;
  const char* sanitizer;  // "" for none
  const char* compiler;
  const char* vulkan_library;
  const char* glslang;
};

const BuildInfo& build_info();
// "kvtierd 0.1.0 (git 1a2b3c4d5e6f, Release)\ncompiler: ...\nvulkan: ...\nglslang: ..."
std::string version_text(const std::string& program);

}  // namespace kvtier
